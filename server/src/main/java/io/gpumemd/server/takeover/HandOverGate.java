package io.gpumemd.server.takeover;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;

/**
 * Whether the daemon applies requests, and how many it is applying: what lets a hand-over
 * snapshot books that nothing changes under it. Every piece of work that changes the books (a
 * unary call, a KeepAlive message, a housekeeping round) {@link #enter}s first and {@link
 * #exit}s when done; {@link #close} refuses new work and waits for the work in progress. A
 * request refused here was not applied at all, which is what lets the client send it again to
 * the successor.
 *
 * <p>Thread-safe and lock-free on the way in and out (every call and message passes here): a
 * volatile flag and a {@link LongAdder}. Entering counts first and then reads the flag; closing
 * sets the flag and then reads the count: whichever comes second sees the other, so no work
 * starts unseen after a close. A hand-over is rare, so {@link #close} polls the count.
 */
public final class HandOverGate {
  /** A gate that is never closed: daemons without a take-over socket, tests. */
  public static final HandOverGate ALWAYS_OPEN = new HandOverGate(false);

  private final LongAdder inFlight = new LongAdder();
  private volatile boolean closed;

  /** @param closed start closed: a successor serves nothing until it holds the running daemon's state */
  public HandOverGate(boolean closed) {
    this.closed = closed;
  }

  public HandOverGate() {
    this(false);
  }

  /**
   * Starts a piece of work.
   *
   * @return false when the gate is closed: the work must not be done (and not {@link #exit}ed)
   */
  public boolean enter() {
    inFlight.increment();
    if (closed) {
      inFlight.decrement();
      return false;
    }
    return true;
  }

  /**
   * Starts a piece of work that is part of one already let in (a lease a KeepAlive message
   * started, still running when the message is done): counted even while the gate is closed,
   * since the closing waits for its parent anyway.
   */
  public void join() {
    inFlight.increment();
  }

  /** Ends a piece of work that {@link #enter} or {@link #join} let in. */
  public void exit() {
    inFlight.decrement();
  }

  /** True while closed: requests are answered as "moving", not applied. */
  public boolean closed() {
    return closed;
  }

  /**
   * Closes the gate and waits for the work in progress.
   *
   * @return the number of pieces of work still running when the wait ended (0: quiescent)
   */
  int close(long waitMillis) throws InterruptedException {
    closed = true;
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMillis);
    while (inFlight.sum() > 0 && System.nanoTime() < deadline) {
      LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(1));
      if (Thread.interrupted()) {
        throw new InterruptedException();
      }
    }
    return (int) Math.min(Integer.MAX_VALUE, inFlight.sum());
  }

  /** Opens the gate: the hand-over did not happen, or (a successor) the running daemon's state is here. */
  public void open() {
    closed = false;
  }
}
