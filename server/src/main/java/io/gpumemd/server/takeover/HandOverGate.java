package io.gpumemd.server.takeover;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Whether the daemon applies requests, and how many it is applying: what lets a hand-over
 * snapshot books that nothing changes under it. Every piece of work that changes the books (a
 * unary call, a KeepAlive message, a housekeeping round) {@link #enter}s first and {@link
 * #exit}s when done; {@link #close} refuses new work and waits for the work in progress. A
 * request refused here was not applied at all, which is what lets the client send it again to
 * the successor.
 *
 * <p>Thread-safe: a short lock guards the count; entering an open gate is one lock round.
 */
public final class HandOverGate {
  /** A gate that is never closed: daemons without a take-over socket, tests. */
  public static final HandOverGate ALWAYS_OPEN = new HandOverGate();

  private final ReentrantLock lock = new ReentrantLock();
  private final Condition idle = lock.newCondition();
  private int inFlight;
  private boolean closed;

  /**
   * Starts a piece of work.
   *
   * @return false when the gate is closed: the work must not be done (and not {@link #exit}ed)
   */
  public boolean enter() {
    lock.lock();
    try {
      if (closed) {
        return false;
      }
      inFlight++;
      return true;
    } finally {
      lock.unlock();
    }
  }

  /**
   * Starts a piece of work that is part of one already let in (a lease a KeepAlive message
   * started, still running when the message is done): counted even while the gate is closed,
   * since the closing waits for its parent anyway.
   */
  public void join() {
    lock.lock();
    try {
      inFlight++;
    } finally {
      lock.unlock();
    }
  }

  /** Ends a piece of work that {@link #enter} or {@link #join} let in. */
  public void exit() {
    lock.lock();
    try {
      if (--inFlight == 0) {
        idle.signalAll();
      }
    } finally {
      lock.unlock();
    }
  }

  /** True while closed: requests are answered as "moving", not applied. */
  public boolean closed() {
    lock.lock();
    try {
      return closed;
    } finally {
      lock.unlock();
    }
  }

  /**
   * Closes the gate and waits for the work in progress.
   *
   * @return the number of pieces of work still running when the wait ended (0: quiescent)
   */
  int close(long waitMillis) throws InterruptedException {
    lock.lock();
    try {
      closed = true;
      long nanos = TimeUnit.MILLISECONDS.toNanos(waitMillis);
      while (inFlight > 0 && nanos > 0) {
        nanos = idle.awaitNanos(nanos);
      }
      return inFlight;
    } finally {
      lock.unlock();
    }
  }

  /** Opens the gate again: the hand-over did not happen. */
  void open() {
    lock.lock();
    try {
      closed = false;
    } finally {
      lock.unlock();
    }
  }
}
