package io.gpumemd.server.takeover;

import io.gpumemd.server.books.BooksGate;
import java.util.Queue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;

/**
 * Whether the daemon applies requests, and how many it is applying: what lets a hand-over
 * snapshot books that nothing changes under it. Every piece of work that changes the books (a
 * unary call, a KeepAlive message, a housekeeping round, an fd-channel fetch's grant, through
 * {@link BooksGate}) {@link #enter}s first and {@link
 * #exit}s when done; {@link #close} refuses new work and waits for the work in progress. A
 * request refused here was not applied at all, which is what lets the client send it again to
 * the successor.
 *
 * <p>Thread-safe and lock-free on the way in and out (every call and message passes here): a
 * volatile flag and a {@link LongAdder}. Entering counts first and then reads the flag; closing
 * sets the flag and then reads the count: whichever comes second sees the other, so no work
 * starts unseen after a close. A hand-over is rare, so {@link #close} polls the count.
 *
 * <p>While a hand-over has it closed ({@link #closeForHandOver}), a refused request may wait for the outcome instead of
 * being answered at once ({@link #hold}): the client would only call again every few
 * milliseconds and be refused again until the successor serves, and its next try after that
 * comes up to a retry interval late. A held request is answered when the hand-over ends, still
 * unapplied: "moving" at once if the gate opens again ({@link #open}; the client calls again
 * and is served here), or told that the session moved once the successor serves and this
 * daemon's connections are sent away ({@link #moved}; the client calls again there, at once).
 * Held requests are not counted in flight: they never ran. A successor's gate, closed until it
 * holds the state, holds nothing (its rehearsal expects the "moving" answer).
 */
public final class HandOverGate implements BooksGate {
  /** A gate that is never closed: daemons without a take-over socket, tests. */
  public static final HandOverGate ALWAYS_OPEN = new HandOverGate(false);

  private final LongAdder inFlight = new LongAdder();
  private volatile boolean closed;
  /** Requests refused while handing over wait here ({@link #hold}); true: while a hand-over has the gate closed. */
  private volatile boolean holding;
  private final Queue<Outcome> held = new ConcurrentLinkedQueue<>();
  /** Set by {@link #moved}: the successor serves, and what is refused here belongs there now. */
  private volatile boolean movedAway;

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
  @Override
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
  @Override
  public void exit() {
    inFlight.decrement();
  }

  /** True while closed: requests are answered as "moving", not applied. */
  @Override
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
    // The count seen by the loop is the answer: a read after it can catch a refused request's
    // passing increment (enter counts, then reads the flag, then takes it back) and refuse a
    // quiescent hand-over.
    long running;
    while ((running = inFlight.sum()) > 0 && System.nanoTime() < deadline) {
      LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(1));
      if (Thread.interrupted()) {
        throw new InterruptedException();
      }
    }
    return (int) Math.min(Integer.MAX_VALUE, running);
  }

  /**
   * {@link #close} for a hand-over: requests refused from now on may wait for its end ({@link
   * #hold}) until the gate opens again or {@link #moved}.
   */
  int closeForHandOver(long waitMillis) throws InterruptedException {
    holding = true;
    return close(waitMillis);
  }

  /** Opens the gate: the hand-over did not happen, or (a successor) the running daemon's state is here. */
  public void open() {
    closed = false;
    release(false);
  }

  /**
   * Lets a request that {@link #enter} refused wait for the hand-over's outcome, which {@code
   * outcome} is given once, on the thread that ends the hand-over.
   *
   * @return false when nothing is held (no hand-over has the gate closed, or it ended): answer the
   *     request now
   */
  @Override
  public boolean hold(Outcome outcome) {
    if (!holding) {
      return false;
    }
    held.add(outcome);
    // A release that began meanwhile may have drained the queue before the add: take it back and
    // answer now, unless the release got it.
    return holding || !held.remove(outcome);
  }

  /**
   * The successor serves and this daemon's listeners sent their connections away (GOAWAY): the
   * held requests are told their session moved, and the clients call again at once, there. The
   * gate stays closed.
   */
  public void moved() {
    movedAway = true;
    release(true);
  }

  /** Whether the successor serves ({@link #moved}): a request refused now can go there at once. */
  public boolean movedAway() {
    return movedAway;
  }

  private void release(boolean moved) {
    holding = false;
    for (Outcome o; (o = held.poll()) != null; ) {
      try {
        o.ended(moved);
      } catch (RuntimeException e) {
        // a call cancelled under the answer: its client calls again anyway
      }
    }
  }
}
