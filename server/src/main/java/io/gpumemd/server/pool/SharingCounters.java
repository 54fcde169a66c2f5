package io.gpumemd.server.pool;

import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The sharing figures of one pool: share tokens made, live holds, shared blocks, published
 * objects and their bytes. The tokens, holds and names themselves are the session layer's; it
 * tells the pool what changed.
 *
 * <p>Thread-safety. Only what the pool must check against its blocks takes the pool lock: a
 * block becoming shared or held ({@link #blockShared}, {@link #holdTaken}: the pool checks the
 * block is leased), a first name ({@link #publish}: checked against the published-bytes limit
 * and added in one step) and a last name ({@link #unpublished}); {@code publishedBytes} is
 * guarded by that lock. This class takes the lock itself where it needs it, except in {@link
 * #holdTaken}, which the pool calls under its lock. The other updates need no lock: a token made, a hold released, a shared
 * block returned, a name more or less on an already-published block.
 *
 * <p>Read in a {@link PoolStats} snapshot (under the lock), so exact where the pool's
 * invariants need it: every increment of shared blocks and live holds is made under the lock,
 * and each decrement precedes the release it belongs to, so they read between 0 and the live
 * leases; published objects is one atomic count whose first and last names change with the
 * bytes under the lock, so it reads 0 exactly when published bytes do (the session layer orders
 * the names of one block, so a name is dropped only after it was counted). Beyond that, a snapshot
 * taken while tokens are made or holds and names dropped on other threads may or may not
 * include those calls.
 */
final class SharingCounters {
  private final ReentrantLock lock;
  private final HolderMappings holders;
  private final PoolCounters counters;
  private final long publishedLimitBytes;
  private final LongAdder shares = new LongAdder();
  private final LongAdder liveHolds = new LongAdder();
  private final LongAdder sharedBlocks = new LongAdder();
  /** One atomic count, not an adder: a reading must be a value it had (see the class javadoc). */
  private final AtomicLong publishedObjects = new AtomicLong();
  /** Guarded by the pool lock. */
  private long publishedBytes;

  /**
   * @param lock the owning {@link DevicePool}'s lock, which guards {@code holders} and {@code
   *     counters} too
   */
  SharingCounters(ReentrantLock lock, HolderMappings holders, PoolCounters counters, long publishedLimitBytes) {
    this.lock = lock;
    this.holders = holders;
    this.counters = counters;
    this.publishedLimitBytes = publishedLimitBytes;
  }

  /** A leased block got its first share token or name; takes the pool lock. */
  void blockShared(Block block) {
    lock.lock();
    try {
      checkLeased(block);
      sharedBlocks.increment();
    } finally {
      lock.unlock();
    }
  }

  /** The last hold on a shared block is gone; no lock. */
  void sharedBlockReturned() {
    sharedBlocks.decrement();
  }

  /** A share token was made; no lock. */
  void shareMade() {
    shares.increment();
  }

  /**
   * A holder took a hold on a leased block, and may map its segment from now on; takes the pool
   * lock.
   */
  void attached(Block block, String holder) {
    lock.lock();
    try {
      checkLeased(block);
      holders.mapped(block.segment, holder);
      counters.increment(PoolMetric.ATTACHES);
      liveHolds.increment();
    } finally {
      lock.unlock();
    }
  }

  /** A hold was released; no lock. */
  void holdReleased() {
    liveHolds.decrement();
  }

  /**
   * A leased block gets its first name; takes the pool lock.
   *
   * @return false, changing nothing, when its bytes would pass the published-bytes limit
   */
  boolean publish(Block block) {
    lock.lock();
    try {
      checkLeased(block);
      if (publishedBytes + block.size > publishedLimitBytes) {
        return false;
      }
      publishedBytes += block.size;
      publishedObjects.incrementAndGet();
      return true;
    } finally {
      lock.unlock();
    }
  }

  /** A name more for an already-published block; no lock. */
  void publishedAgain() {
    publishedObjects.incrementAndGet();
  }

  /**
   * A name of a block went away: without the lock while the block keeps another name; with it
   * for the last, whose bytes stop counting.
   */
  void unpublished(Block block, boolean lastName) {
    if (!lastName) {
      publishedObjects.decrementAndGet();
      return;
    }
    lock.lock();
    try {
      publishedObjects.decrementAndGet();
      publishedBytes -= block.size;
    } finally {
      lock.unlock();
    }
  }

  /** Sharing, holding or publishing applies to leased blocks only; with the pool lock held. */
  private static void checkLeased(Block block) {
    if (block.state != Block.State.LEASED) {
      throw new IllegalStateException("sharing a block that is not leased: " + block);
    }
  }

  long publishedLimitBytes() {
    return publishedLimitBytes;
  }

  long publishedBytes() {
    return publishedBytes;
  }

  long publishedObjects() {
    return publishedObjects.get();
  }

  long liveHolds() {
    return liveHolds.sum();
  }

  long sharedBlocks() {
    return sharedBlocks.sum();
  }

  /** Fills in the figures this class keeps; with the pool lock held. */
  void report(long[] v) {
    v[PoolMetric.SHARES.ordinal()] = shares.sum();
    v[PoolMetric.LIVE_HOLDS.ordinal()] = liveHolds.sum();
    v[PoolMetric.SHARED_BLOCKS.ordinal()] = sharedBlocks.sum();
    v[PoolMetric.PUBLISHED_OBJECTS.ordinal()] = publishedObjects.get();
    v[PoolMetric.PUBLISHED_BYTES.ordinal()] = publishedBytes;
    v[PoolMetric.PUBLISHED_LIMIT_BYTES.ordinal()] = publishedLimitBytes;
  }
}
