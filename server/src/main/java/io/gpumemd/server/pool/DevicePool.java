package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The memory pool of one device: caches released blocks for reuse, caps what it keeps, and
 * counts hits, misses and returns.
 *
 * <h2>Algorithm</h2>
 *
 * <pre>
 *   segment (one backend allocation, e.g. 2 MiB in the small pool)
 *   +---------+------------------+-------+---------------------------------+
 *   | leased  | free (remainder) | leased| free                            |
 *   +---------+------------------+-------+---------------------------------+
 *     blocks form a list in address order; free blocks are also in a size-ordered index
 *     of the segment's owner
 * </pre>
 *
 * <ol>
 *   <li>Every lease is for an owner ({@link SegmentOwner}): blocks of different owners never
 *       share a segment, and a segment never changes owner, because a client's mapping cannot
 *       be revoked. Memory passes between owners only through a backend free and allocation.
 *   <li>A request is rounded up to 512 B ({@link SizeClasses}); up to 1 MiB it uses the small
 *       pool, above the large pool.
 *   <li><b>Hit:</b> the best-fitting free block of the owner ({@link FreeBlocks}, {@link
 *       BlockIndex}), split when enough remains (small: 512 B, large: over 1 MiB); the rest
 *       stays free.
 *   <li><b>Miss:</b> a new segment for the owner (2 MiB for small requests, the request rounded
 *       to 2 MiB for large ones), zeroed whole before any of it is handed out when the backend
 *       does not guarantee zeroed memory ({@code scrubbed_bytes}): it may hold what another
 *       owner wrote. If it would push the pool past its budget, idle segments of any owner are
 *       evicted least recently used first ({@link IdleSegments}) and the allocation retried ({@code
 *       alloc_retries}); if it still does not fit, or the backend itself is out of memory after
 *       a retry, the lease fails with {@link ExhaustedException} stating the pool ({@code
 *       ooms}). A miss that would fit once evicted segments are unmapped by their clients waits
 *       for that, up to {@code unmapWaitMillis}, on the thread that asked (never a transport
 *       thread).
 *   <li><b>Release:</b> the block becomes free and coalesces with free neighbours. A segment
 *       whose blocks are all free is <i>cached</i> (idle). While cached bytes exceed the
 *       retention cap, the least recently used idle segment is evicted. A release that carries
 *       a completion event waits, block still in use, until the event completes ({@link
 *       PendingEvents}, {@link #pollEvents}).
 *   <li><b>Eviction</b> frees a whole idle segment. A segment that a holder may have mapped is
 *       not freed at once: the holder is asked to unmap it ({@link HolderMappings}, {@link
 *       HolderRequests}) and it is freed when every such holder has confirmed or ended.
 * </ol>
 *
 * <p>Byte accounting: {@code reserved = leased + client_cached + cached + remainder +
 * awaiting_event + awaiting_unmap}, where client_cached counts leased blocks their clients keep
 * closed in their own cache tier, cached the wholly free segments and remainder the free
 * blocks of segments that also hold leases. The retention cap bounds cached + client_cached;
 * when clients hold more, or a miss or a trim needs their memory, they are asked to give
 * blocks back ({@link HolderRequests#requestCacheReturn}). The budget bounds {@code reserved} plus allocations in
 * flight. {@link PoolInvariants} checks all of it.
 *
 * <h2>Thread-safety</h2>
 *
 * One {@link ReentrantLock} guards this object and its parts; the critical sections are index
 * look-ups and list surgery. Backend calls (allocate, free, zero, event queries) and unmap
 * requests always run after the lock is released: work found under the lock is collected in an
 * {@link AfterUnlock} and run by the calling thread once it has unlocked.
 */
public final class DevicePool implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(DevicePool.class);
  /** Longest single wait for unmaps before the deadline is checked again on the ticker. */
  private static final long UNMAP_WAIT_SLICE_NANOS = TimeUnit.MILLISECONDS.toNanos(10);
  /**
   * How long a miss that no known memory can serve waits for clients' answers to a request for
   * blocks they may have cached without the pool knowing yet (their notices lag by about a
   * millisecond); a refusal that is certain costs this much more.
   */
  private static final long NOTICE_GRACE_NANOS = TimeUnit.MILLISECONDS.toNanos(10);
  /**
   * How long a backend out-of-memory that the pool's own books do not explain is retried: the
   * device's count can run ahead of the pool's while a free or another allocation is under way.
   */
  private static final long BACKEND_SETTLE_NANOS = TimeUnit.MILLISECONDS.toNanos(100);

  private final DeviceInfo device;
  final MemoryBackend backend;
  final HolderRequests holderRequests;
  private final Ticker ticker;
  private final long limitBytes;
  private final long publishedLimitBytes;
  private final long unmapWaitNanos;
  private final long maxOversizeBytes;
  final ReentrantLock lock = new ReentrantLock();
  /** Signalled when memory a miss may wait for comes back: an unmapped segment, a client-cached block. */
  private final Condition memoryBack = lock.newCondition();

  // ---- guarded by lock; package-private for PoolInvariants and the pool's tests ----
  final FreeBlocks free;
  final IdleSegments idle = new IdleSegments();
  final HolderMappings holders = new HolderMappings();
  final PendingEvents events = new PendingEvents();
  final PoolCounters counters = new PoolCounters();
  final Map<Long, Segment> liveSegments = new HashMap<>();
  /** Client-cached bytes by holder, and the holders asked to give theirs back (not yet done). */
  final Map<String, Long> clientCachedByHolder = new HashMap<>();
  private final Set<String> returnAsked = new HashSet<>();
  long clientCachedBytes;
  /** Bytes of segments given up by the pool whose backend free has not finished yet. */
  private long freeingBytes;
  /** Counts the times memory came back, so that a waiter never sleeps through one. */
  private long memoryEpoch;
  private long retentionCapBytes;
  private long nextBlockId = 1;
  private long nextSegmentId;
  private long inFlightBytes;
  long reservedBytes;
  long leasedBytes;
  private long peakLeasedBytes;
  long activeLeases;
  /** Sharing figures (the holds themselves are the session layer's). */
  long liveHolds;
  long sharedBlocks;
  long publishedObjects;
  long publishedBytes;
  private boolean closed;

  /**
   * @param device the device this pool serves
   * @param backend where segments come from
   * @param settings budget, retention cap, oversize rule and unmap wait
   * @param holderRequests asks holders to unmap segments before they are freed
   * @param segmentIdBase first segment id; pools of different devices use disjoint ranges so
   *     that a segment id names one segment daemon-wide
   * @param ticker the clock of the unmap wait
   */
  public DevicePool(DeviceInfo device, MemoryBackend backend, PoolSettings settings,
      HolderRequests holderRequests, long segmentIdBase, Ticker ticker) {
    this.device = device;
    this.backend = backend;
    this.holderRequests = holderRequests;
    this.ticker = ticker;
    this.limitBytes = settings.limitBytes();
    this.publishedLimitBytes = settings.publishedLimitBytes();
    this.retentionCapBytes = settings.retentionCapBytes();
    this.unmapWaitNanos = TimeUnit.MILLISECONDS.toNanos(settings.unmapWaitMillis());
    this.maxOversizeBytes = settings.maxOversizeBytes();
    this.free = new FreeBlocks(maxOversizeBytes);
    this.nextSegmentId = segmentIdBase;
  }

  public DeviceInfo device() {
    return device;
  }

  public long limitBytes() {
    return limitBytes;
  }

  /** Most a cached block may exceed a large request and still serve it ({@link SizeClasses#largestFit}). */
  public long maxOversizeBytes() {
    return maxOversizeBytes;
  }

  // ------------------------------------------------------------------------------ leasing

  /**
   * Fast path: leases a cached block of the owner if one fits, without any backend call.
   *
   * @return the leased block (a hit), or {@code null} when serving it needs a backend allocation
   */
  public LeasedBlock tryLeaseCached(long requested, String holder, SegmentOwner owner) {
    long size = SizeClasses.roundUp(requested);
    lock.lock();
    try {
      checkOpen();
      Block block = takeCached(size, holder, owner.key());
      return block == null ? null : new LeasedBlock(block, true);
    } finally {
      lock.unlock();
    }
  }

  /**
   * Leases a block of at least {@code requested} bytes for a holder.
   *
   * @param requested bytes asked for; 0 &lt; requested &lt;= the budget
   * @param zero zero the block before returning it
   * @param holder the session that will map the block
   * @param owner whose memory it is: the block comes from a segment of this owner only
   * @throws ExhaustedException when the budget or the device memory is exhausted
   * @throws io.gpumemd.server.backend.BackendException when the backend fails for another reason
   */
  public LeasedBlock lease(long requested, boolean zero, String holder, SegmentOwner owner) {
    long size = SizeClasses.roundUp(requested);
    Block block;
    lock.lock();
    try {
      checkOpen();
      block = takeCached(size, holder, owner.key());
    } finally {
      lock.unlock();
    }
    LeasedBlock leased = block != null ? new LeasedBlock(block, true) : leaseFromNewSegment(size, holder, owner);
    // A block carved from a segment allocated for this very lease already reads as zeros: the
    // backend guarantees it, or the pool scrubbed the segment (leaseFromNewSegment).
    if (zero && leased.poolHit()) {
      zeroOrRelease(leased.block());
    }
    return leased;
  }

  /** Zeroes a leased block outside the lock; on failure the block goes back before rethrowing. */
  private void zeroOrRelease(Block block) {
    try {
      backend.zero(block.segment.memory, block.offset, block.size);
    } catch (RuntimeException e) {
      release(block, null);
      throw e;
    }
  }

  private LeasedBlock leaseFromNewSegment(long size, String holder, SegmentOwner owner) {
    long segmentBytes = SizeClasses.segmentBytes(size);
    boolean retried = false;
    long unmapDeadline = ticker.nanos() + unmapWaitNanos;
    long noticeDeadline = 0;
    long settleDeadline = ticker.nanos() + BACKEND_SETTLE_NANOS;
    long epoch = 0;
    while (true) {
      AfterUnlock after = afterUnlock();
      boolean waitForUnmaps = false;
      lock.lock();
      try {
        checkOpen();
        epoch = memoryEpoch;
        // Someone may have returned a fitting block while we were outside the lock.
        Block block = takeCached(size, holder, owner.key());
        if (block != null) {
          return new LeasedBlock(block, true);
        }
        if (!fitsBudget(segmentBytes)) {
          if (evictUntilFits(segmentBytes, after)) {
            counters.increment(PoolMetric.ALLOC_RETRIES);
          }
          if (!fitsBudget(segmentBytes)) {
            // Evicted segments that clients still map are freed as soon as they confirm the
            // unmap, and blocks clients keep in their caches come back as soon as they are
            // asked (usually within a round trip): wait for that rather than refuse.
            if (fitsBudgetOnceGivenBack(segmentBytes)) {
              askCacheReturns(0, after);
              waitForUnmaps = ticker.nanos() < unmapDeadline;
            } else if (noticeDeadline == 0) {
              // Clients tell the pool what they cached within a millisecond or so: a block closed
              // just now may not be known yet. Ask every holder on this device, once, and give
              // their answers a short while.
              for (String mapper : holders.holders()) {
                after.askCacheReturn(mapper, 0);
              }
              noticeDeadline = ticker.nanos() + NOTICE_GRACE_NANOS;
              waitForUnmaps = true;
            } else {
              waitForUnmaps = ticker.nanos() < Math.min(noticeDeadline, unmapDeadline);
            }
            if (!waitForUnmaps) {
              counters.increment(PoolMetric.OOMS);
              throw exhausted(size, overdueReturns(after) ? "pool limit reached; clients did not give back "
                  + "their cached blocks within the unmap wait" : "pool limit reached");
            }
          }
        }
        if (!waitForUnmaps) {
          inFlightBytes += segmentBytes;
        }
      } finally {
        lock.unlock();
        after.run(); // sends the unmap requests
      }
      if (waitForUnmaps) {
        awaitMemoryBack(unmapDeadline, epoch);
        continue;
      }

      SegmentMemory memory;
      try {
        memory = backend.allocate(device.ordinal(), segmentBytes, owner);
      } catch (BackendOutOfMemoryException e) {
        AfterUnlock evicted = afterUnlock();
        boolean waitForMemory = false;
        lock.lock();
        try {
          inFlightBytes -= segmentBytes;
          epoch = memoryEpoch;
          // The device itself is full (other users of the GPU, or the host capacity): give
          // back everything cached and try once more before refusing. Memory on its way back
          // (frees running on other threads, unmaps, clients' cached blocks) is waited for.
          boolean freedSome = !retried && enforceCap(0, evicted) > 0;
          if (!freedSome) {
            // A free in progress always completes (in milliseconds): wait for it whatever the
            // deadline. Unmaps and clients' cached blocks are waited for up to the unmap wait.
            waitForMemory = freeingBytes > 0 || ((holders.awaitingUnmapBytes() > 0 || clientCachedBytes > 0)
                && ticker.nanos() < unmapDeadline)
                // The pool's books fit, the device's count does not: it counts memory being freed
                // or allocated elsewhere right now. Give it a moment before calling it full.
                || ticker.nanos() < settleDeadline;
            if (!waitForMemory) {
              counters.increment(PoolMetric.OOMS);
              throw exhausted(size, "device memory exhausted (" + e.getMessage() + ")");
            }
            askCacheReturns(0, evicted);
          } else {
            counters.increment(PoolMetric.ALLOC_RETRIES);
            retried = true;
          }
        } finally {
          lock.unlock();
          evicted.run();
        }
        if (waitForMemory) {
          // Frees finish on their own: wait a slice for them even past both deadlines.
          awaitMemoryBack(Math.max(ticker.nanos() + UNMAP_WAIT_SLICE_NANOS, Math.max(unmapDeadline, settleDeadline)),
              epoch);
        }
        continue;
      } catch (RuntimeException e) {
        lock.lock();
        try {
          inFlightBytes -= segmentBytes;
        } finally {
          lock.unlock();
        }
        throw e;
      }

      boolean scrubbed = scrubIfNeeded(memory, segmentBytes);
      lock.lock();
      try {
        inFlightBytes -= segmentBytes;
        counters.increment(PoolMetric.BACKEND_ALLOCS);
        if (scrubbed) {
          counters.add(PoolMetric.SCRUBBED_BYTES, segmentBytes);
        }
        if (!closed) {
          Segment segment = new Segment(nextSegmentId++, owner.key(), memory, SizeClasses.isSmall(size));
          Block whole = new Block(segment, nextBlockId++, 0, segmentBytes, Block.State.FREE);
          segment.head = whole;
          liveSegments.put(segment.id, segment);
          reservedBytes += segmentBytes;
          counters.increment(PoolMetric.MISSES);
          log.debug("device {}: new segment {} of {} bytes for a {}-byte block",
              device.ordinal(), segment.id, segmentBytes, size);
          return new LeasedBlock(carve(whole, size, holder), false);
        }
        counters.increment(PoolMetric.BACKEND_FREES);
      } finally {
        lock.unlock();
      }
      // Lost a race with close(): nobody will ever free this segment but us (outside the lock,
      // like every backend call).
      backend.free(memory);
      throw closedException();
    }
  }

  /**
   * Zeroes a fresh segment whole, outside the lock, when the backend does not guarantee zeroed
   * memory: it may hold bytes another owner wrote into a segment the pool freed. Once per
   * segment; its blocks are never zeroed again for this reason, since it never changes owner.
   * On failure the segment goes back to the backend before rethrowing.
   *
   * @return true if it zeroed the segment
   */
  private boolean scrubIfNeeded(SegmentMemory memory, long segmentBytes) {
    if (backend.freshSegmentsAreZeroed()) {
      return false;
    }
    try {
      backend.zero(memory, 0, segmentBytes);
      return true;
    } catch (RuntimeException e) {
      backend.free(memory);
      lock.lock();
      try {
        inFlightBytes -= segmentBytes;
        counters.increment(PoolMetric.BACKEND_ALLOCS);
        counters.increment(PoolMetric.BACKEND_FREES);
      } finally {
        lock.unlock();
      }
      throw e;
    }
  }

  private boolean fitsBudget(long segmentBytes) {
    return reservedBytes + inFlightBytes + segmentBytes <= limitBytes;
  }

  /**
   * Whether the allocation would fit once segments awaiting unmaps are freed and clients give
   * back their cached blocks (optimistic: a returned block frees memory only when its segment
   * becomes idle and is evicted).
   */
  private boolean fitsBudgetOnceGivenBack(long segmentBytes) {
    return reservedBytes - holders.awaitingUnmapBytes() - clientCachedBytes + inFlightBytes + segmentBytes
        <= limitBytes;
  }

  /** Wakes whoever waits for memory; call with the lock held. */
  private void memoryCameBack() {
    memoryEpoch++;
    memoryBack.signalAll();
  }

  /**
   * Waits for memory to come back (an unmap confirmed, a client-cached block released, a free
   * finished) or for one slice, whichever is first; the caller then looks again. {@code epoch}
   * is {@link #memoryEpoch} as the caller saw it when it decided to wait: if memory came back
   * since (between its unlock and this lock), there is nothing to wait for.
   */
  private void awaitMemoryBack(long deadline, long epoch) {
    lock.lock();
    try {
      // Bounded slices: the deadline is on the injectable ticker, the wait on the real clock.
      long remaining = deadline - ticker.nanos();
      if (!closed && remaining > 0 && memoryEpoch == epoch) {
        memoryBack.awaitNanos(Math.min(remaining, UNMAP_WAIT_SLICE_NANOS));
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      lock.unlock();
    }
  }

  /** Takes the owner's best-fitting cached block and leases it (a hit), or returns null. */
  private Block takeCached(long size, String holder, String owner) {
    assert lock.isHeldByCurrentThread();
    Block block = free.takeBestFit(size, owner);
    if (block == null) {
      return null;
    }
    counters.increment(PoolMetric.HITS);
    return carve(block, size, holder);
  }

  /** Marks a free block (already out of the index) leased, splitting off what it does not need. */
  private Block carve(Block block, long size, String holder) {
    Segment segment = block.segment;
    if (SizeClasses.shouldSplit(block.size, size)) {
      Block rest = new Block(segment, nextBlockId++, block.offset + size, block.size - size, Block.State.FREE);
      rest.prev = block;
      rest.next = block.next;
      if (block.next != null) {
        block.next.prev = rest;
      }
      block.next = rest;
      block.size = size;
      free.add(rest);
    }
    idle.remove(segment);
    block.state = Block.State.LEASED;
    segment.usedBytes += block.size;
    leasedBytes += block.size;
    activeLeases++;
    peakLeasedBytes = Math.max(peakLeasedBytes, leasedBytes);
    holders.mapped(segment, holder);
    return block;
  }

  // ----------------------------------------------------------------------------- releasing

  /**
   * Returns a leased block. With a completion event the block is reused only once the event
   * has completed; the pool owns and closes the event.
   */
  public void release(Block block, CompletionEvent event) {
    AfterUnlock after = afterUnlock();
    lock.lock();
    try {
      if (block.state == Block.State.CLIENT_CACHED) {
        uncache(block);
      } else if (block.state == Block.State.LEASED) {
        leasedBytes -= block.size;
        activeLeases--;
      } else {
        throw new IllegalStateException("release of a block that is not leased: " + block);
      }
      if (event != null && !closed) {
        block.state = Block.State.AWAITING_EVENT;
        events.add(block, event);
        event = null; // now owned by the pending events
        return;
      }
      returnToCache(block, after);
    } finally {
      lock.unlock();
      after.run();
      if (event != null) {
        // Closed pool: nothing will wait for the event, but we own it.
        event.close();
      }
    }
  }

  // ------------------------------------------------------------------------- client cache

  /**
   * A holder closed a leased block into its own cache tier: still its lease (it counts against
   * its quota and comes back when it ends), but no longer in use. Counts against the retention
   * cap like the pool's own cache.
   *
   * @throws IllegalStateException when the block is not leased
   */
  public void clientCached(Block block, String holder) {
    AfterUnlock after = afterUnlock();
    lock.lock();
    try {
      if (block.state != Block.State.LEASED) {
        throw new IllegalStateException("client-caching a block that is not leased: " + block);
      }
      block.state = Block.State.CLIENT_CACHED;
      block.cachedBy = holder;
      leasedBytes -= block.size;
      activeLeases--;
      clientCachedBytes += block.size;
      clientCachedByHolder.merge(holder, block.size, Long::sum);
      enforceCap(retentionCapBytes, after);
    } finally {
      lock.unlock();
      after.run();
    }
  }

  /**
   * A holder handed a block from its cache tier out again locally.
   *
   * @throws IllegalStateException when the block is not client-cached
   */
  public void clientReused(Block block) {
    lock.lock();
    try {
      if (block.state != Block.State.CLIENT_CACHED) {
        throw new IllegalStateException("reusing a block that is not client-cached: " + block);
      }
      uncache(block);
      block.state = Block.State.LEASED;
      leasedBytes += block.size;
      activeLeases++;
      peakLeasedBytes = Math.max(peakLeasedBytes, leasedBytes);
    } finally {
      lock.unlock();
    }
  }

  /** The backend has freed a segment the pool gave up: the device has that memory again. */
  void freed(Segment segment) {
    lock.lock();
    try {
      freeingBytes -= segment.bytes;
      memoryCameBack();
    } finally {
      lock.unlock();
    }
  }

  /**
   * Adds what a client reports its own cache did: deltas of its cumulative counters, which the
   * session layer has validated (never negative). The pool's figures saturate at {@link
   * Long#MAX_VALUE}: clients' reports are summed, and every tenant reads the sum.
   */
  public void addClientCounters(long hits, long returns) {
    assert hits >= 0 && returns >= 0 : hits + ", " + returns;
    lock.lock();
    try {
      counters.add(PoolMetric.CLIENT_CACHE_HITS, hits);
      counters.add(PoolMetric.CLIENT_CACHE_RETURNS, returns);
    } finally {
      lock.unlock();
    }
  }

  private void uncache(Block block) {
    assert lock.isHeldByCurrentThread() && block.state == Block.State.CLIENT_CACHED;
    clientCachedBytes -= block.size;
    String holder = block.cachedBy;
    block.cachedBy = null;
    if (clientCachedByHolder.merge(holder, -block.size, Long::sum) == 0) {
      clientCachedByHolder.remove(holder);
      returnAsked.remove(holder);
    }
    memoryCameBack();
  }

  /**
   * Asks holders to give back client-cached blocks: the largest holders first until {@code
   * bytes} are asked for, or every holder for all of theirs when {@code bytes} is 0. A holder
   * already asked is not asked again until it has given everything back.
   */
  private void askCacheReturns(long bytes, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    if (clientCachedBytes == 0) {
      return;
    }
    List<Map.Entry<String, Long>> byBytes = new ArrayList<>(clientCachedByHolder.entrySet());
    byBytes.sort(Map.Entry.<String, Long>comparingByValue().reversed());
    long asked = 0;
    for (Map.Entry<String, Long> e : byBytes) {
      if (bytes > 0 && asked >= bytes) {
        break;
      }
      asked += e.getValue();
      if (returnAsked.add(e.getKey())) {
        after.askCacheReturn(e.getKey(), bytes == 0 ? 0 : Math.min(e.getValue(), bytes - asked + e.getValue()));
      }
    }
  }

  /** Reports holders asked to give back cached blocks that still hold some; true if any. */
  private boolean overdueReturns(AfterUnlock after) {
    boolean any = false;
    for (String holder : returnAsked) {
      if (clientCachedByHolder.containsKey(holder)) {
        after.cacheReturnOverdue(holder);
        any = true;
      }
    }
    return any;
  }

  /** Puts a no-longer-used block back: coalesce, index, cache the segment if idle, apply the cap. */
  private void returnToCache(Block block, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    Segment segment = block.segment;
    block.state = Block.State.FREE;
    segment.usedBytes -= block.size;
    if (segment.state != Segment.State.LIVE) {
      return; // the pool was closed under it
    }
    Block prev = block.prev;
    if (prev != null && prev.state == Block.State.FREE) {
      free.remove(prev);
      prev.size += block.size;
      unlink(block);
      block = prev;
    }
    Block next = block.next;
    if (next != null && next.state == Block.State.FREE) {
      free.remove(next);
      block.size += next.size;
      unlink(next);
    }
    free.add(block);
    if (segment.idle()) {
      idle.add(segment);
      enforceCap(retentionCapBytes, after);
    }
    // A block whose segment the cap evicted at once went back to the backend, not the cache:
    // that is an eviction, not a return.
    if (segment.state == Segment.State.LIVE) {
      counters.increment(PoolMetric.RETURNS);
    }
  }

  private static void unlink(Block block) {
    block.prev.next = block.next;
    if (block.next != null) {
      block.next.prev = block.prev;
    }
    block.prev = null;
    block.next = null;
  }

  /**
   * Checks completion events of released blocks and returns those that completed to the cache.
   * Called periodically by the server; cheap when nothing is pending.
   */
  public void pollEvents() {
    List<PendingEvents.Pending> pending;
    lock.lock();
    try {
      if (events.isEmpty()) {
        return;
      }
      pending = events.snapshot();
    } finally {
      lock.unlock();
    }
    List<PendingEvents.Pending> done = new ArrayList<>();
    for (PendingEvents.Pending p : pending) {
      boolean complete;
      try {
        complete = p.event().isComplete();
      } catch (RuntimeException e) {
        log.warn("device {}: completion event query failed, treating it as complete: {}",
            device.ordinal(), e.toString());
        complete = true;
      }
      if (complete) {
        done.add(p);
      }
    }
    if (done.isEmpty()) {
      return;
    }
    AfterUnlock after = afterUnlock();
    lock.lock();
    try {
      for (Block block : events.removeCompleted(done)) {
        if (block.state == Block.State.AWAITING_EVENT) {
          returnToCache(block, after);
        }
      }
    } finally {
      lock.unlock();
      after.run();
    }
    done.forEach(p -> p.event().close());
  }

  // ------------------------------------------------------------------------------ eviction

  /**
   * Sets the retention cap and evicts at once down to it.
   *
   * @param capBytes at most {@link #limitBytes()} (the caller validates)
   * @return bytes of segments evicted
   */
  public long setRetentionCap(long capBytes) {
    if (capBytes < 0 || capBytes > limitBytes) {
      throw new IllegalArgumentException("retention cap " + capBytes + " outside 0.." + limitBytes);
    }
    AfterUnlock after = afterUnlock();
    lock.lock();
    try {
      retentionCapBytes = capBytes;
      return enforceCap(capBytes, after);
    } finally {
      lock.unlock();
      after.run();
    }
  }

  /**
   * Evicts cached segments, least recently used first, until at most {@code keepBytes} remain
   * cached, in the pool and in its clients' caches together: clients are asked for their cached
   * blocks, and the call waits for them (up to the unmap wait) to evict what comes back. May
   * block: call it off the transport threads.
   *
   * @return bytes of segments evicted
   */
  public long trim(long keepBytes) {
    long evicted = 0;
    long deadline = ticker.nanos() + unmapWaitNanos;
    while (true) {
      AfterUnlock after = afterUnlock();
      boolean waitForClients;
      long epoch;
      lock.lock();
      try {
        epoch = memoryEpoch;
        evicted += enforceCap(keepBytes, after);
        waitForClients = idle.bytes() + clientCachedBytes > keepBytes && clientCachedBytes > 0;
        if (waitForClients && ticker.nanos() >= deadline) {
          overdueReturns(after);
          waitForClients = false;
        }
      } finally {
        lock.unlock();
        after.run();
      }
      if (!waitForClients) {
        return evicted;
      }
      awaitMemoryBack(deadline, epoch);
    }
  }

  /**
   * Evicts idle segments, least recently used first, until the pool's cache and the clients'
   * caches together hold at most {@code cap}; if the clients' caches alone exceed it, asks
   * their holders for the excess.
   */
  private long enforceCap(long cap, AfterUnlock after) {
    long evicted = 0;
    Segment segment;
    while (idle.bytes() + clientCachedBytes > cap && (segment = idle.pollLeastRecent()) != null) {
      evicted += evict(segment, after);
    }
    if (clientCachedBytes > cap) {
      askCacheReturns(clientCachedBytes - cap, after);
    }
    return evicted;
  }

  /** Evicts idle segments until the allocation fits; true if anything was evicted. */
  private boolean evictUntilFits(long segmentBytes, AfterUnlock after) {
    // Evicting only helps if what can be freed at once would make room.
    if (reservedBytes - idle.bytes() + inFlightBytes + segmentBytes > limitBytes) {
      return false;
    }
    boolean any = false;
    Segment segment;
    while (!fitsBudget(segmentBytes) && (segment = idle.pollLeastRecent()) != null) {
      evict(segment, after);
      any = true;
    }
    return any;
  }

  /** Evicts one idle segment (already out of the idle list). */
  private long evict(Segment segment, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    Block whole = segment.head;
    assert whole.state == Block.State.FREE && whole.next == null && whole.size == segment.bytes
        : "evicting a segment that is not wholly free: " + segment;
    free.remove(whole);
    liveSegments.remove(segment.id);
    counters.increment(PoolMetric.EVICTIONS);
    var mappers = holders.awaitUnmaps(segment);
    if (mappers.isEmpty()) {
      freeSegment(segment, after);
    } else {
      for (String holder : mappers) {
        after.askUnmap(holder, segment.id);
      }
    }
    return segment.bytes;
  }

  private void freeSegment(Segment segment, AfterUnlock after) {
    segment.state = Segment.State.FREED;
    reservedBytes -= segment.bytes;
    freeingBytes += segment.bytes; // until the backend has freed it (AfterUnlock, then freed())
    counters.increment(PoolMetric.BACKEND_FREES);
    after.free(segment);
  }

  // ------------------------------------------------------------------------------ sharing

  /**
   * A leased block became shared (its first share token or name): from now on it stays leased
   * until the session layer has dropped its last hold.
   */
  public void blockShared(Block block) {
    lock.lock();
    try {
      checkLeased(block);
      sharedBlocks++;
    } finally {
      lock.unlock();
    }
  }

  /** The last hold on a shared block is gone; {@link #release} follows. */
  public void sharedBlockReturned() {
    lock.lock();
    try {
      sharedBlocks--;
    } finally {
      lock.unlock();
    }
  }

  /** A share token was made. */
  public void shareMade() {
    lock.lock();
    try {
      counters.increment(PoolMetric.SHARES);
    } finally {
      lock.unlock();
    }
  }

  /**
   * A holder takes a hold on a leased block of another lease: it may map the block's segment
   * from now on, so the segment is not freed before it unmaps it or ends (rule 2).
   *
   * @throws IllegalStateException when the block is not leased (it went back meanwhile)
   */
  public void attached(Block block, String holder) {
    lock.lock();
    try {
      checkLeased(block);
      holders.mapped(block.segment, holder);
      counters.increment(PoolMetric.ATTACHES);
      liveHolds++;
    } finally {
      lock.unlock();
    }
  }

  /** A hold taken by {@link #attached} was released. */
  public void holdReleased() {
    lock.lock();
    try {
      liveHolds--;
    } finally {
      lock.unlock();
    }
  }

  /**
   * A shared block gets its first published name: it counts against the published-bytes limit.
   *
   * @return false, changing nothing, when it would pass the limit
   */
  public boolean publish(Block block) {
    lock.lock();
    try {
      checkLeased(block);
      if (publishedBytes + block.size > publishedLimitBytes) {
        return false;
      }
      publishedBytes += block.size;
      publishedObjects++;
      return true;
    } finally {
      lock.unlock();
    }
  }

  /** A published name of a block went away; with its last name the block stops counting. */
  public void unpublished(Block block, boolean lastName) {
    lock.lock();
    try {
      publishedObjects--;
      if (lastName) {
        publishedBytes -= block.size;
      }
    } finally {
      lock.unlock();
    }
  }

  /** A name more for an already-published block (its bytes count once). */
  public void publishedAgain() {
    lock.lock();
    try {
      publishedObjects++;
    } finally {
      lock.unlock();
    }
  }

  public long publishedLimitBytes() {
    return publishedLimitBytes;
  }

  private static void checkLeased(Block block) {
    if (block.state != Block.State.LEASED) {
      throw new IllegalStateException("sharing a block that is not leased: " + block);
    }
  }

  // ------------------------------------------------------------------------------ holders

  /** A holder confirms it has unmapped a segment the pool asked it to unmap. */
  public void unmapped(String holder, long segmentId) {
    AfterUnlock after = afterUnlock();
    lock.lock();
    try {
      Segment segment = holders.unmapped(holder, segmentId);
      if (segment != null) {
        freeSegment(segment, after);
        memoryCameBack();
      }
    } finally {
      lock.unlock();
      after.run();
    }
  }

  /** A holder ended: it maps nothing any more. */
  public void holderEnded(String holder) {
    AfterUnlock after = afterUnlock();
    lock.lock();
    try {
      List<Segment> freed = holders.holderEnded(holder);
      for (Segment segment : freed) {
        freeSegment(segment, after);
      }
      if (!freed.isEmpty()) {
        memoryCameBack();
      }
    } finally {
      lock.unlock();
      after.run();
    }
  }

  /** Segments evicted and waiting for this holder's unmap (to ask again after a reconnect). */
  public List<Long> awaitingUnmapBy(String holder) {
    lock.lock();
    try {
      return holders.awaitingUnmapBy(holder);
    } finally {
      lock.unlock();
    }
  }

  /** Number of segments a holder may have mapped. */
  public int mappedSegments(String holder) {
    lock.lock();
    try {
      return holders.mappedBy(holder);
    } finally {
      lock.unlock();
    }
  }

  // ------------------------------------------------------------------------------ reporting

  public PoolStats stats() {
    lock.lock();
    try {
      long[] v = counters.snapshot();
      v[PoolMetric.LEASED_BYTES.ordinal()] = leasedBytes;
      v[PoolMetric.CLIENT_CACHED_BYTES.ordinal()] = clientCachedBytes;
      v[PoolMetric.CACHED_BYTES.ordinal()] = idle.bytes();
      v[PoolMetric.REMAINDER_BYTES.ordinal()] = remainderBytes();
      v[PoolMetric.AWAITING_EVENT_BYTES.ordinal()] = events.bytes();
      v[PoolMetric.AWAITING_UNMAP_BYTES.ordinal()] = holders.awaitingUnmapBytes();
      v[PoolMetric.RESERVED_BYTES.ordinal()] = reservedBytes;
      v[PoolMetric.PEAK_LEASED_BYTES.ordinal()] = peakLeasedBytes;
      v[PoolMetric.ACTIVE_LEASES.ordinal()] = activeLeases;
      v[PoolMetric.CACHED_BLOCKS.ordinal()] = free.size();
      v[PoolMetric.SEGMENTS.ordinal()] = liveSegments.size();
      v[PoolMetric.SEGMENTS_AWAITING_UNMAP.ordinal()] = holders.awaitingUnmap().size();
      v[PoolMetric.BLOCKS_AWAITING_EVENT.ordinal()] = events.size();
      v[PoolMetric.RETENTION_CAP_BYTES.ordinal()] = retentionCapBytes;
      v[PoolMetric.CAPACITY_BYTES.ordinal()] = device.capacityBytes();
      v[PoolMetric.LIMIT_BYTES.ordinal()] = limitBytes;
      v[PoolMetric.LIVE_HOLDS.ordinal()] = liveHolds;
      v[PoolMetric.SHARED_BLOCKS.ordinal()] = sharedBlocks;
      v[PoolMetric.PUBLISHED_OBJECTS.ordinal()] = publishedObjects;
      v[PoolMetric.PUBLISHED_BYTES.ordinal()] = publishedBytes;
      v[PoolMetric.PUBLISHED_LIMIT_BYTES.ordinal()] = publishedLimitBytes;
      return new PoolStats(device.ordinal(), v);
    } finally {
      lock.unlock();
    }
  }

  /** Free bytes inside segments that also hold leases (split remainders). */
  long remainderBytes() {
    assert lock.isHeldByCurrentThread();
    return reservedBytes - leasedBytes - clientCachedBytes - idle.bytes() - events.bytes()
        - holders.awaitingUnmapBytes();
  }

  private ExhaustedException exhausted(long size, String why) {
    // Built only on the failure path.
    return new ExhaustedException("device " + device.ordinal() + ": cannot lease "
        + Sizes.format(size) + ": " + why + " (requested=" + size + ", leased=" + leasedBytes
        + ", client_cached=" + clientCachedBytes + ", cached=" + idle.bytes() + ", remainder=" + remainderBytes() + ", awaiting_event="
        + events.bytes() + ", awaiting_unmap=" + holders.awaitingUnmapBytes() + ", in_flight="
        + inFlightBytes + ", limit=" + limitBytes + ")");
  }

  /**
   * Checks the pool's structure; for tests. Throws {@link AssertionError} describing the first
   * violation (see {@link PoolInvariants}).
   */
  public void verifyInvariants() {
    lock.lock();
    try {
      PoolInvariants.verify(this);
    } finally {
      lock.unlock();
    }
  }

  private AfterUnlock afterUnlock() {
    return new AfterUnlock(this);
  }

  private void checkOpen() {
    if (closed) {
      throw closedException();
    }
  }

  private IllegalStateException closedException() {
    return new IllegalStateException("device pool " + device.ordinal() + " is closed");
  }

  /**
   * Frees every segment, leased or not, mapped or not: the daemon is exiting. Idempotent.
   */
  @Override
  public void close() {
    List<Segment> all = new ArrayList<>();
    List<PendingEvents.Pending> pending;
    lock.lock();
    try {
      if (closed) {
        return;
      }
      closed = true;
      all.addAll(liveSegments.values());
      all.addAll(holders.awaitingUnmap());
      liveSegments.clear();
      holders.clear();
      clientCachedByHolder.clear();
      returnAsked.clear();
      clientCachedBytes = 0;
      idle.clear();
      free.clear();
      pending = events.drain();
      for (Segment s : all) {
        s.state = Segment.State.FREED;
      }
      counters.add(PoolMetric.BACKEND_FREES, all.size());
      reservedBytes = 0;
      memoryCameBack();
    } finally {
      lock.unlock();
    }
    pending.forEach(p -> p.event().close());
    for (Segment s : all) {
      backend.free(s.memory);
    }
  }
}
