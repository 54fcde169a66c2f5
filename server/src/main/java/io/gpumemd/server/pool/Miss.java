package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One lease that no cached block could serve: it gets a new segment for its owner (2 MiB for a
 * small request, the request rounded to 2 MiB for a large one, {@link SizeClasses}; then up to
 * the backend's segment granularity, {@link #segmentBytes}). Made per
 * miss by {@link DevicePool#lease}, on the thread that asked (never a transport thread, since
 * it may wait); it holds the miss's deadlines and runs its loop:
 *
 * <pre>
 *   +--------------------------------------------------------------------+
 *   v                                                                    |
 *   1 budget (locked) ------ a block came back meanwhile ------> leased, a hit
 *   |  over budget: evict; memory on its way back? wait a slice ---------+
 *   |  nothing coming back: ExhaustedException                           |
 *   v                                                                    |
 *   2 allocate (unlocked)                                                |
 *   |  device out of memory: evict everything once, or wait a slice -----+
 *   v
 *   3 scrub, install (locked) ------------------------------> leased, a miss
 * </pre>
 *
 * <ol>
 *   <li><b>Budget.</b> If the segment would push the pool past its budget ({@link Budget}),
 *       idle segments of any owner are evicted ({@link Eviction#evictUntilFits}; {@code
 *       alloc_retries}). If it still does not fit but would once evicted segments are unmapped
 *       and clients give back their cached blocks, those are asked for and waited for, up to
 *       the unmap wait ({@code --unmap-wait-ms}). Otherwise every holder on the device is asked
 *       once for blocks it may have cached without the pool knowing yet (clients report their
 *       cache within about a millisecond), and their answers get {@link #NOTICE_GRACE_NANOS}.
 *       Past that, the pool's {@link BudgetRelief} (when set: {@code --park-idle-objects}) is
 *       asked, outside the lock, to free memory, and the budget looked at again while it frees
 *       some; then {@link ExhaustedException} stating the pool ({@code ooms}).
 *   <li><b>Allocate</b>, outside the lock, with the segment counted in flight. When the
 *       backend itself is out of memory (the device is full: other users of the GPU, the host
 *       capacity), everything cached is evicted and the allocation retried once. Memory on its
 *       way back is waited for: frees under way always (they finish in milliseconds), unmaps
 *       and clients' cached blocks up to the unmap wait, and an out-of-memory the pool's own
 *       books do not explain for {@link #BACKEND_SETTLE_NANOS}. Past that: {@link
 *       ExhaustedException}.
 *   <li><b>Scrub and install.</b> When the backend does not guarantee zeroed memory, the
 *       segment is zeroed whole before any of it is handed out ({@code scrubbed_bytes}): it may
 *       hold what another owner wrote. Then it joins the pool ({@link BlockCarver#install}) and
 *       the lease is carved from it ({@code misses}).
 * </ol>
 *
 * <p>It works on the pool's {@link PoolCore} and asks its {@link Eviction} for room.
 *
 * <p>Not thread-safe: one thread runs a miss. It takes the pool lock for phases 1 and 3 and for
 * the bookkeeping of phase 2, and makes every backend call and request to holders outside it.
 */
final class Miss {
  private static final Logger log = LoggerFactory.getLogger(Miss.class);
  /**
   * How long a miss that no known memory can serve waits for clients' answers to a request for
   * blocks they may have cached without the pool knowing yet (their notices lag by about a
   * millisecond); a refusal that is certain costs this much more.
   */
  static final long NOTICE_GRACE_NANOS = TimeUnit.MILLISECONDS.toNanos(10);
  /**
   * How long a backend out-of-memory that the pool's own books do not explain is retried: the
   * device's count can run ahead of the pool's while a free or another allocation is under way.
   */
  static final long BACKEND_SETTLE_NANOS = TimeUnit.MILLISECONDS.toNanos(100);

  /** What phase 1 decided. */
  private enum Next { HIT, WAIT, ALLOCATE, RELIEVE }

  private final PoolCore core;
  private final Eviction eviction;
  private final Ticker ticker;
  private final long size;
  private final long segmentBytes;
  private final String holder;
  private final SegmentOwner owner;
  /** Until when unmaps and clients' cached blocks are waited for. */
  private final long unmapDeadline;
  /** Until when a backend out-of-memory the books do not explain is retried. */
  private final long settleDeadline;
  /** Until when holders' answers to the one request for all their cached blocks are waited for; 0 = not asked. */
  private long noticeDeadline;
  /** Whether the backend's out-of-memory was already answered by evicting everything cached. */
  private boolean retried;
  /** Whether the {@link BudgetRelief} was asked and freed nothing: it is not asked again. */
  private boolean reliefSpent;
  /** {@link MemoryWaiters#epoch} when the last phase looked at the pool. */
  private long epoch;
  /** The block phase 1 found cached. */
  private Block hit;
  /**
   * For a wake: the offset and size pairs to lease in the new segment, whose size and class are
   * the old one's; null for a lease. A wake takes no cached block: it needs a whole segment.
   */
  private final long[] wakeRanges;
  private final boolean small;
  /** A wake's leased blocks, in the order of {@link #wakeRanges}. */
  private Block[] woken;

  /** @param size the request rounded up ({@link SizeClasses#roundUp}) */
  Miss(PoolCore core, Eviction eviction, long size, String holder, SegmentOwner owner) {
    this(core, eviction, size, segmentBytes(size, core.segmentGranularity), SizeClasses.isSmall(size), null, holder,
        owner);
  }

  /** A wake's miss: see {@link DevicePool#wake}. */
  static Block[] wake(PoolCore core, Eviction eviction, long segmentBytes, boolean small, long[] ranges, String holder,
      SegmentOwner owner) {
    long bytes = 0;
    for (int i = 1; i < ranges.length; i += 2) {
      bytes += ranges[i];
    }
    Miss miss = new Miss(core, eviction, bytes, segmentBytes, small, ranges, holder, owner);
    miss.run();
    return miss.woken;
  }

  private Miss(PoolCore core, Eviction eviction, long size, long segmentBytes, boolean small, long[] wakeRanges,
      String holder, SegmentOwner owner) {
    this.core = core;
    this.eviction = eviction;
    this.ticker = core.ticker;
    this.size = size;
    this.segmentBytes = segmentBytes;
    this.small = small;
    this.wakeRanges = wakeRanges;
    this.holder = holder;
    this.owner = owner;
    long now = ticker.nanos();
    this.unmapDeadline = now + core.unmapWaitNanos;
    this.settleDeadline = now + BACKEND_SETTLE_NANOS;
  }

  /**
   * The segment a miss allocates for a rounded request: {@link SizeClasses#segmentBytes} rounded
   * up to the backend's granularity (a CUDA VMM allocation must be a multiple of it; what the
   * rounding adds stays free in the segment for later leases of its owner).
   */
  static long segmentBytes(long size, long granularity) {
    long bytes = SizeClasses.segmentBytes(size);
    long rest = bytes % granularity;
    return rest == 0 ? bytes : Math.addExact(bytes, granularity - rest);
  }

  /**
   * Runs the miss to a lease.
   *
   * @return the leased block: a hit when a fitting block was returned meanwhile
   * @throws ExhaustedException when the budget or the device memory is exhausted
   */
  LeasedBlock run() {
    while (true) {
      switch (checkBudget()) {
        case HIT -> {
          return new LeasedBlock(hit, true);
        }
        case WAIT -> core.waiters.await(unmapDeadline, epoch);
        case RELIEVE -> reliefSpent = core.relief.relieve(core.device.ordinal(), segmentBytes) == 0;
        case ALLOCATE -> {
          SegmentMemory memory = allocate();
          if (memory != null) {
            return install(memory);
          }
        }
      }
    }
  }

  /** Phase 1, under the lock: a hit, room in the budget (now in flight), or a wait. */
  private Next checkBudget() {
    AfterUnlock after = new AfterUnlock(core);
    core.lock.lock();
    try {
      core.checkOpen();
      epoch = core.waiters.epoch();
      // Someone may have returned a fitting block while we were outside the lock.
      hit = wakeRanges == null ? core.takeCached(size, holder, owner.key()) : null;
      if (hit != null) {
        return Next.HIT;
      }
      if (!core.budget.fits(segmentBytes)) {
        if (eviction.evictUntilFits(segmentBytes, after)) {
          core.counters.increment(PoolMetric.ALLOC_RETRIES);
        }
        if (!core.budget.fits(segmentBytes)) {
          return waitOrRefuse(after);
        }
      }
      core.budget.allocating(segmentBytes);
      return Next.ALLOCATE;
    } finally {
      core.lock.unlock();
      after.run(); // sends the unmap requests
    }
  }

  /** Over budget even after eviction: waits for memory on its way back, or refuses. */
  private Next waitOrRefuse(AfterUnlock after) {
    boolean wait;
    // Evicted segments that clients still map are freed as soon as they confirm the unmap,
    // and blocks clients keep in their caches come back as soon as they are asked (usually
    // within a round trip): wait for that rather than refuse.
    if (core.budget.fitsWithout(core.holders.awaitingUnmapBytes() + core.clientCache.bytes(), segmentBytes)) {
      core.clientCache.askReturns(0, after);
      wait = ticker.nanos() < unmapDeadline;
    } else if (noticeDeadline == 0) {
      // A block closed just now may not be known yet: ask every holder on this device, once.
      for (String mapper : core.holders.holders()) {
        after.askCacheReturn(mapper, 0);
      }
      noticeDeadline = ticker.nanos() + NOTICE_GRACE_NANOS;
      wait = true;
    } else {
      wait = ticker.nanos() < Math.min(noticeDeadline, unmapDeadline);
    }
    if (!wait) {
      // Before refusing, the layers above may free memory (--park-idle-objects), outside the lock.
      if (core.relief != null && !reliefSpent) {
        return Next.RELIEVE;
      }
      core.counters.increment(PoolMetric.OOMS);
      throw exhausted(core.clientCache.overdueReturns(after) ? "pool limit reached; clients did not give back "
          + "their cached blocks within the unmap wait" : "pool limit reached");
    }
    return Next.WAIT;
  }

  /** Phase 2, outside the lock: the backend allocation, or null to look again. */
  private SegmentMemory allocate() {
    try {
      return core.backend.allocate(core.device.ordinal(), segmentBytes, owner);
    } catch (BackendOutOfMemoryException e) {
      deviceFull(e);
      return null;
    } catch (RuntimeException e) {
      allocationFailed();
      throw e;
    }
  }

  /**
   * The device itself is full: gives back everything cached and tries once more, waits for
   * memory on its way back, or refuses.
   */
  private void deviceFull(BackendOutOfMemoryException e) {
    AfterUnlock after = new AfterUnlock(core);
    boolean wait = false;
    core.lock.lock();
    try {
      core.budget.allocationEnded(segmentBytes);
      epoch = core.waiters.epoch();
      if (!retried && eviction.enforceCap(0, after) > 0) {
        core.counters.increment(PoolMetric.ALLOC_RETRIES);
        retried = true;
      } else {
        long now = ticker.nanos();
        // A free in progress always completes (in milliseconds): wait for it whatever the
        // deadline. Unmaps and clients' cached blocks are waited for up to the unmap wait.
        wait = core.budget.freeingBytes() > 0
            || ((core.holders.awaitingUnmapBytes() > 0 || core.clientCache.bytes() > 0) && now < unmapDeadline)
            // The pool's books fit, the device's count does not: it counts memory being freed
            // or allocated elsewhere right now. Give it a moment before calling it full.
            || now < settleDeadline;
        if (!wait) {
          core.counters.increment(PoolMetric.OOMS);
          throw exhausted("device memory exhausted (" + e.getMessage() + ")");
        }
        core.clientCache.askReturns(0, after);
      }
    } finally {
      core.lock.unlock();
      after.run();
    }
    if (wait) {
      // Frees finish on their own: wait a slice for them even past both deadlines.
      core.waiters.await(Math.max(ticker.nanos() + MemoryWaiters.SLICE_NANOS, Math.max(unmapDeadline, settleDeadline)),
          epoch);
    }
  }

  /** The allocation failed for another reason than memory: it is no longer in flight. */
  private void allocationFailed() {
    core.lock.lock();
    try {
      core.budget.allocationEnded(segmentBytes);
    } finally {
      core.lock.unlock();
    }
  }

  /** Phase 3: scrubs the new segment if needed, installs it and carves the lease from it. */
  private LeasedBlock install(SegmentMemory memory) {
    boolean scrubbed = scrubIfNeeded(memory);
    core.lock.lock();
    try {
      core.budget.allocationEnded(segmentBytes);
      core.counters.increment(PoolMetric.BACKEND_ALLOCS);
      if (scrubbed) {
        core.counters.add(PoolMetric.SCRUBBED_BYTES, segmentBytes);
      }
      if (!core.closed()) {
        Block whole = core.carver.install(owner.key(), memory, small);
        core.budget.installed(segmentBytes);
        log.debug("device {}: new segment {} of {} bytes for {} bytes of {}", core.device.ordinal(),
            whole.segment.id, segmentBytes, size, wakeRanges == null ? "a block" : "sleeping leases");
        core.holders.mapped(whole.segment, holder);
        if (wakeRanges != null) {
          woken = core.carver.carveRanges(whole, wakeRanges);
          return null;
        }
        core.counters.increment(PoolMetric.MISSES);
        // Reads as zeros: the backend guarantees it, or it was just scrubbed.
        Block block = core.carver.carve(whole, size);
        return new LeasedBlock(block, false);
      }
      core.counters.increment(PoolMetric.BACKEND_FREES);
    } finally {
      core.lock.unlock();
    }
    // Lost a race with close(): nobody will ever free this segment but us (outside the lock,
    // like every backend call).
    core.backend.free(memory);
    throw core.closedException();
  }

  /**
   * Zeroes a fresh segment whole, outside the lock, when the backend does not guarantee zeroed
   * memory: it may hold bytes another owner wrote into a segment the pool freed. Once per
   * segment; its blocks are never zeroed again for this reason, since it never changes owner.
   * On failure the segment goes back to the backend before rethrowing.
   *
   * @return true if it zeroed the segment
   */
  private boolean scrubIfNeeded(SegmentMemory memory) {
    if (core.backend.freshSegmentsAreZeroed()) {
      return false;
    }
    try {
      core.backend.zero(memory, 0, segmentBytes);
      return true;
    } catch (RuntimeException e) {
      core.backend.free(memory);
      core.lock.lock();
      try {
        core.budget.allocationEnded(segmentBytes);
        core.counters.increment(PoolMetric.BACKEND_ALLOCS);
        core.counters.increment(PoolMetric.BACKEND_FREES);
      } finally {
        core.lock.unlock();
      }
      throw e;
    }
  }

  /** The refusal, with the pool's state; built only on the failure path, under the lock. */
  private ExhaustedException exhausted(String why) {
    return new ExhaustedException("device " + core.device.ordinal() + ": cannot "
        + (wakeRanges == null ? "lease " : "wake ") + Sizes.format(size) + (wakeRanges == null ? "" : " of sleeping leases")
        + ": " + why + " (requested=" + size + ", leased=" + core.carver.leasedBytes()
        + ", client_cached=" + core.clientCache.bytes() + ", cached=" + core.carver.cachedBytes()
        + ", remainder=" + core.remainderBytes() + ", awaiting_event=" + core.events.bytes()
        + ", awaiting_unmap=" + core.holders.awaitingUnmapBytes() + ", in_flight=" + core.budget.inFlightBytes()
        + ", limit=" + core.budget.limitBytes() + ")");
  }
}
