package io.gpumemd.server.pool;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Supplier;

/**
 * What one device's pool is made of: its one lock, the books that lock guards ({@link
 * BlockCarver}, {@link Budget}, {@link ClientCacheBooks}, {@link HolderMappings}, {@link
 * PendingEvents}, {@link PoolCounters}, {@link SharingCounters}), the waiters for memory, and
 * what every part reads and never changes (device, backend, holders' requests, clock, unmap wait,
 * segment granularity). The parts that work on the pool ({@link Miss}, {@link Eviction}, {@link
 * Returns}, {@link PoolSleep}, {@link AfterUnlock}, {@link PoolStats}, {@link PoolInvariants}, {@link
 * PoolSnapshotWriter}, {@link PoolRestorer}) receive this core, not the {@link DevicePool}
 * facade; each changes a book only through that book's own methods.
 *
 * <p>Thread-safety: the books are guarded by {@link #lock} (see each); the final fields are
 * immutable. {@link #segmentFreed} and {@link #locked} take the lock; the other methods are
 * called with it held.
 */
final class PoolCore {
  final DeviceInfo device;
  final MemoryBackend backend;
  final HolderRequests holderRequests;
  final Ticker ticker;
  final long unmapWaitNanos;
  /** The backend's {@link MemoryBackend#segmentGranularity}: new segments are multiples of it. */
  final long segmentGranularity;
  final ReentrantLock lock = new ReentrantLock();

  // ---- the books, guarded by lock (see each); package-private for the parts and the tests ----
  final BlockCarver carver;
  final Budget budget;
  final ClientCacheBooks clientCache;
  final HolderMappings holders = new HolderMappings();
  final PendingEvents events = new PendingEvents();
  final PoolCounters counters = new PoolCounters();
  final MemoryWaiters waiters;
  final SharingCounters sharing;
  /** Asked by a miss before it refuses for lack of budget; null: nothing to ask ({@link PoolSleep#budgetRelief}). */
  volatile BudgetRelief relief;
  private boolean closed;

  /** See {@link DevicePool#DevicePool}. */
  PoolCore(DeviceInfo device, MemoryBackend backend, PoolSettings settings, HolderRequests holderRequests,
      long segmentIdBase, Ticker ticker) {
    this.device = device;
    this.backend = backend;
    this.holderRequests = holderRequests;
    this.ticker = ticker;
    this.unmapWaitNanos = TimeUnit.MILLISECONDS.toNanos(settings.unmapWaitMillis());
    this.segmentGranularity = granularity(backend, device.ordinal());
    this.carver = new BlockCarver(lock, settings.maxOversizeBytes(), segmentIdBase);
    this.budget = new Budget(settings.limitBytes());
    this.clientCache = new ClientCacheBooks(lock, carver);
    this.waiters = new MemoryWaiters(lock, ticker);
    this.sharing = new SharingCounters(lock, holders, counters, settings.publishedLimitBytes());
  }

  /** The backend's segment granularity of a device, checked once when its pool is made. */
  private static long granularity(MemoryBackend backend, int device) {
    long granularity = backend.segmentGranularity(device);
    if (granularity <= 0) {
      throw new IllegalArgumentException("segment granularity of device " + device + ": " + granularity
          + " (expected: > 0)");
    }
    return granularity;
  }

  /** Runs {@code read} under the lock: for the cold paths that only look (or change one book). */
  <T> T locked(Supplier<T> read) {
    lock.lock();
    try {
      return read.get();
    } finally {
      lock.unlock();
    }
  }

  boolean closed() {
    return closed;
  }

  /**
   * The pool refuses everything from now on. With the lock held, or on a pool nobody else sees
   * yet (a restore that failed).
   */
  void markClosed() {
    closed = true;
  }

  void checkOpen() {
    if (closed) {
      throw closedException();
    }
  }

  IllegalStateException closedException() {
    return new IllegalStateException("device pool " + device.ordinal() + " is closed");
  }

  /** Leases the owner's best-fitting cached block to a holder (a hit), or returns null. */
  Block takeCached(long size, String holder, String owner) {
    Block block = carver.leaseBestFit(size, owner);
    if (block == null) {
      return null;
    }
    counters.increment(PoolMetric.HITS);
    holders.mapped(block.segment, holder);
    return block;
  }

  /** A segment by id: live, or evicted and awaiting unmaps; null when freed (or never made). */
  Segment segment(long segmentId) {
    assert lock.isHeldByCurrentThread();
    Segment segment = carver.live.get(segmentId);
    return segment != null ? segment : holders.awaitingUnmap(segmentId);
  }

  /** Free bytes inside segments that also hold leases (split remainders). */
  long remainderBytes() {
    assert lock.isHeldByCurrentThread();
    return budget.reservedBytes() - carver.leasedBytes() - clientCache.bytes() - carver.cachedBytes()
        - events.bytes() - holders.awaitingUnmapBytes();
  }

  /** The backend has freed a segment the pool gave up: the device has that memory again. Takes the lock. */
  void segmentFreed(Segment segment) {
    lock.lock();
    try {
      budget.freed(segment.bytes);
      waiters.memoryCameBack();
    } finally {
      lock.unlock();
    }
  }
}
