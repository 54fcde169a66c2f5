package io.gpumemd.server.pool;

import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The sharing figures of one pool: share tokens made, live holds, shared blocks, published
 * objects and their bytes. The tokens, holds and names themselves are the session layer's; it
 * tells the pool what changed, through {@link DevicePool}'s sharing calls.
 *
 * <p>Thread-safety: only what must be checked against the pool's blocks takes the pool's lock,
 * which this class takes itself: a block becoming shared or held ({@link #blockShared}, {@link
 * #attached}: the block must be leased, and a holder may map its segment from then on), a first
 * name ({@link #publish}: checked against the published-bytes limit and added in one step) and
 * a last name ({@link #unpublished}); {@code publishedBytes} is guarded by that lock. The other
 * calls take no lock: a token made, a hold released, a shared block returned, a name more or
 * less on a block that keeps one.
 *
 * <p>What a {@link PoolStats} snapshot (taken under the lock) reads: every increment of shared
 * blocks and live holds is made under the lock, and each decrement happens before the release
 * it belongs to, so shared blocks read between 0 and the live leases, and live holds never
 * below 0. Published objects is one atomic count (not an adder, whose sum is no value it ever
 * had), whose first and last name of a block change with its bytes under the lock; as the
 * session layer orders the names of one block, it reads 0 exactly when published bytes do.
 * Beyond those bounds a snapshot may or may not include the calls that run without the lock
 * on other threads at that moment.
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
   * Bytes of published blocks that sleep with their lease (issue 35): no device memory, but
   * their room under the limit is kept for their wake, which cannot be refused for it. Guarded by
   * the pool lock.
   */
  private long sleepingPublishedBytes;

  /**
   * @param lock the owning pool's lock ({@link PoolCore#lock}), which guards {@code holders} and {@code
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
      if (publishedBytes + sleepingPublishedBytes + block.size > publishedLimitBytes) {
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

  /**
   * A published block goes to sleep with its lease, its {@code names} names with it: they stop
   * counting as published objects and bytes (the block is freed next), and its bytes keep their
   * room under the limit; takes the pool lock.
   */
  void publishedAsleep(Block block, int names) {
    lock.lock();
    try {
      checkLeased(block);
      publishedObjects.addAndGet(-names);
      publishedBytes -= block.size;
      sleepingPublishedBytes += block.size;
    } finally {
      lock.unlock();
    }
  }

  /** A name of a sleeping block went away; with its last, its room is given up. Takes the pool lock. */
  void unpublishedAsleep(long bytes, boolean lastName) {
    if (!lastName) {
      return;
    }
    lock.lock();
    try {
      sleepingPublishedBytes -= bytes;
    } finally {
      lock.unlock();
    }
  }

  /** A sleeping published block woke into {@code fresh}: its names count again, in its kept room. */
  void publishedAwake(Block fresh, int names) {
    lock.lock();
    try {
      checkLeased(fresh);
      sleepingPublishedBytes -= fresh.size;
      publishedBytes += fresh.size;
      publishedObjects.addAndGet(names);
    } finally {
      lock.unlock();
    }
  }

  long sleepingPublishedBytes() {
    return sleepingPublishedBytes;
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

  long shares() {
    return shares.sum();
  }

  /** Sets the figures of the pool restored from (restore) on a pool nobody uses yet; with the pool lock held. */
  void restore(long shares, long liveHolds, long sharedBlocks, long publishedObjects, long publishedBytes) {
    assert lock.isHeldByCurrentThread();
    this.shares.add(shares);
    this.liveHolds.add(liveHolds);
    this.sharedBlocks.add(sharedBlocks);
    this.publishedObjects.addAndGet(publishedObjects);
    this.publishedBytes += publishedBytes;
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
