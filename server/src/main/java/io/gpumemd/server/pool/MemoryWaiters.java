package io.gpumemd.server.pool;

import io.gpumemd.common.Ticker;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The threads of one pool that wait for memory to come back (a {@link Miss} over budget, a
 * trim waiting for clients' cached blocks), and what wakes them: an unmap confirmed, a
 * client-cached block released, a backend free finished, the pool closed.
 *
 * <p>A waiter reads {@link #epoch} when it decides to wait, under the lock, and passes it to
 * {@link #await}: memory that came back in between (after its unlock, before the wait) counts,
 * so a waiter never sleeps through it. Each wait is one bounded slice: deadlines are on the
 * pool's injectable {@link Ticker}, the wait on the real clock, so the caller looks again after
 * each slice.
 *
 * <p>Thread-safety: {@link #epoch}, {@link #memoryCameBack} and {@link #closed} are called with
 * the owning pool's lock ({@link PoolCore#lock}) held; {@link #await} takes it.
 */
final class MemoryWaiters {
  /** Longest single wait before the caller checks its deadline again on the ticker. */
  static final long SLICE_NANOS = TimeUnit.MILLISECONDS.toNanos(10);

  private final ReentrantLock lock;
  private final Condition memoryBack;
  private final Ticker ticker;
  /** Counts the times memory came back. */
  private long epoch;
  private boolean closed;

  MemoryWaiters(ReentrantLock lock, Ticker ticker) {
    this.lock = lock;
    this.memoryBack = lock.newCondition();
    this.ticker = ticker;
  }

  long epoch() {
    assert lock.isHeldByCurrentThread();
    return epoch;
  }

  /** Wakes whoever waits for memory. */
  void memoryCameBack() {
    assert lock.isHeldByCurrentThread();
    epoch++;
    memoryBack.signalAll();
  }

  /** The pool closed: nothing will come back, so nobody waits any more. */
  void closed() {
    closed = true;
    memoryCameBack();
  }

  /**
   * Waits for memory to come back or for one slice, whichever is first, unless it came back
   * since {@code seenEpoch} or the deadline has passed; the caller then looks again.
   */
  void await(long deadline, long seenEpoch) {
    lock.lock();
    try {
      long remaining = deadline - ticker.nanos();
      if (!closed && remaining > 0 && epoch == seenEpoch) {
        memoryBack.awaitNanos(Math.min(remaining, SLICE_NANOS));
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      lock.unlock();
    }
  }
}
