package io.gpumemd.server.pool;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.error.ExhaustedException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
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
 * </pre>
 *
 * <ol>
 *   <li>A request is rounded up to 512 B ({@link SizeClasses}). Requests up to 1 MiB use the
 *       small pool, larger ones the large pool; each has its own size-ordered index of free
 *       blocks, ordered by (size, block id).
 *   <li><b>Hit:</b> best fit = the smallest free block at least the rounded size. In the large
 *       pool a block more than {@code maxOversizeBytes} over the request is not used. The block
 *       is split when enough remains (small: 512 B, large: over 1 MiB); the rest stays free.
 *   <li><b>Miss:</b> a new segment (2 MiB for small requests, the request rounded to 2 MiB for
 *       large ones). If it would push the pool past its budget, cached segments are evicted
 *       least recently used first and the allocation retried ({@code allocRetries}); if it
 *       still does not fit, or the backend itself is out of memory after a retry, the lease
 *       fails with {@link ExhaustedException} stating the pool ({@code ooms}). A miss that
 *       would fit once evicted segments are unmapped by their clients waits for that, up to
 *       {@code unmapWaitMillis}, on the thread that asked (never a transport thread).
 *   <li><b>Release:</b> the block becomes free and coalesces with free neighbours. A segment
 *       whose blocks are all free is <i>cached</i>; it joins the LRU list of idle segments.
 *       While cached bytes exceed the retention cap, the least recently used idle segment is
 *       evicted. A release that carries a completion event waits, block still in use, until
 *       the event completes ({@link #pollEvents}).
 *   <li><b>Eviction</b> frees a whole idle segment. A segment that a holder may have mapped is
 *       not freed at once: the holder is asked to unmap it ({@link UnmapRequester}) and it is
 *       freed when every such holder has confirmed or ended.
 * </ol>
 *
 * <p>Byte accounting: {@code reserved = leased + cached + remainder + awaiting_event +
 * awaiting_unmap}, where cached counts wholly free segments and remainder the free blocks of
 * segments that also hold leases. The budget bounds {@code reserved} plus allocations in flight.
 *
 * <h2>Thread-safety</h2>
 *
 * One {@link ReentrantLock} guards all state; the critical sections are index look-ups and
 * list surgery. Backend calls (allocate, free, zero, event queries) and unmap requests always
 * run after the lock is released: work found under the lock is collected in an {@link
 * AfterUnlock} and executed by the calling thread once it has unlocked.
 */
public final class DevicePool implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(DevicePool.class);
  private static final Comparator<Block> BY_SIZE =
      Comparator.<Block>comparingLong(b -> b.size).thenComparingLong(b -> b.id);

  private final DeviceInfo device;
  private final MemoryBackend backend;
  private final UnmapRequester unmapRequester;
  private final long limitBytes;
  private final long maxOversizeBytes;
  private final long unmapWaitNanos;
  private final ReentrantLock lock = new ReentrantLock();
  /** Signalled when a segment that waited for unmaps is freed. */
  private final Condition segmentFreed = lock.newCondition();

  // ---- guarded by lock ----
  private final TreeSet<Block> smallFree = new TreeSet<>(BY_SIZE);
  private final TreeSet<Block> largeFree = new TreeSet<>(BY_SIZE);
  /** Wholly free segments, least recently used first. */
  private final LinkedHashSet<Segment> idleSegments = new LinkedHashSet<>();
  private final Map<Long, Segment> liveSegments = new HashMap<>();
  private final Map<Long, Segment> awaitingUnmap = new HashMap<>();
  private final Map<String, Set<Segment>> segmentsByHolder = new HashMap<>();
  private final List<PendingRelease> awaitingEvent = new ArrayList<>();
  private final Block probe;
  private long retentionCapBytes;
  private long nextBlockId = 1;
  private long nextSegmentId;
  private long inFlightBytes;
  private long reservedBytes;
  private long leasedBytes;
  private long peakLeasedBytes;
  private long activeLeases;
  private long cachedBytes;
  private long awaitingEventBytes;
  private long awaitingUnmapBytes;
  private long hits;
  private long misses;
  private long returns;
  private long evictions;
  private long allocRetries;
  private long ooms;
  private long backendAllocs;
  private long backendFrees;
  private boolean closed;

  private record PendingRelease(Block block, CompletionEvent event) {}

  /**
   * @param device the device this pool serves
   * @param backend where segments come from
   * @param settings budget, retention cap and oversize rule
   * @param unmapRequester asks holders to unmap segments before they are freed
   * @param segmentIdBase first segment id; pools of different devices use disjoint ranges so
   *     that a segment id names one segment daemon-wide
   */
  public DevicePool(DeviceInfo device, MemoryBackend backend, PoolSettings settings,
      UnmapRequester unmapRequester, long segmentIdBase) {
    this.device = device;
    this.backend = backend;
    this.unmapRequester = unmapRequester;
    this.limitBytes = settings.limitBytes();
    this.retentionCapBytes = settings.retentionCapBytes();
    this.maxOversizeBytes = settings.maxOversizeBytes();
    this.unmapWaitNanos = TimeUnit.MILLISECONDS.toNanos(settings.unmapWaitMillis());
    this.nextSegmentId = segmentIdBase;
    this.probe = new Block(null, Long.MIN_VALUE, 0, 0, Block.State.FREE);
  }

  public DeviceInfo device() {
    return device;
  }

  public long limitBytes() {
    return limitBytes;
  }

  // ------------------------------------------------------------------------------ leasing

  /**
   * Fast path: leases a cached block if one fits, without any backend call.
   *
   * @return the leased block, or {@code null} when serving it needs a backend allocation
   */
  public Block tryLeaseCached(long requested, String holder) {
    long size = SizeClasses.roundUp(requested);
    lock.lock();
    try {
      checkOpen();
      Block block = takeCached(size, holder);
      if (block != null) {
        hits++;
      }
      return block;
    } finally {
      lock.unlock();
    }
  }

  /**
   * Leases a block of at least {@code requested} bytes for a holder.
   *
   * @param requested bytes asked for; 0 &lt; requested &lt;= the device's capacity
   * @param zero zero the block before returning it
   * @param holder the session that will map the block
   * @throws ExhaustedException when the budget or the device memory is exhausted
   * @throws BackendException when the backend fails for another reason
   */
  public Block lease(long requested, boolean zero, String holder) {
    long size = SizeClasses.roundUp(requested);
    Block block;
    lock.lock();
    try {
      checkOpen();
      block = takeCached(size, holder);
      if (block != null) {
        hits++;
      }
    } finally {
      lock.unlock();
    }
    if (block == null) {
      block = leaseFromNewSegment(size, holder);
    }
    // A block carved from a segment allocated for this very lease is already zero where the
    // backend guarantees fresh memory reads as zeros.
    if (zero && (block.hit || !backend.freshSegmentsAreZeroed())) {
      zeroOrRelease(block);
    }
    return block;
  }

  /** Zeroes a leased block outside the lock; on failure the block goes back before rethrowing. */
  public void zeroOrRelease(Block block) {
    try {
      backend.zero(block.segment.memory, block.offset, block.size);
    } catch (RuntimeException e) {
      release(block, null);
      throw e;
    }
  }

  private Block leaseFromNewSegment(long size, String holder) {
    long segmentBytes = SizeClasses.segmentBytes(size);
    boolean retried = false;
    long unmapDeadline = System.nanoTime() + unmapWaitNanos;
    while (true) {
      AfterUnlock after = new AfterUnlock();
      boolean waitForUnmaps = false;
      lock.lock();
      try {
        checkOpen();
        // Someone may have returned a fitting block while we were outside the lock.
        Block block = takeCached(size, holder);
        if (block != null) {
          hits++;
          return block;
        }
        if (!fitsBudget(segmentBytes)) {
          if (evictUntilFits(segmentBytes, after)) {
            allocRetries++;
          }
          if (!fitsBudget(segmentBytes)) {
            // Evicted segments that clients still map are freed as soon as they confirm the
            // unmap (usually within a round trip): wait for that rather than refuse.
            waitForUnmaps = fitsBudgetOnceUnmapped(segmentBytes) && System.nanoTime() < unmapDeadline;
            if (!waitForUnmaps) {
              ooms++;
              throw exhausted(size, "pool limit reached");
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
        awaitUnmaps(segmentBytes, unmapDeadline);
        continue;
      }

      SegmentMemory memory;
      try {
        memory = backend.allocate(device.ordinal(), segmentBytes);
      } catch (BackendOutOfMemoryException e) {
        AfterUnlock evicted = new AfterUnlock();
        lock.lock();
        try {
          inFlightBytes -= segmentBytes;
          // The device itself is full (other users of the GPU, or the host capacity): give
          // back everything cached and try once more before refusing.
          boolean freedSome = !retried && evictAllIdle(evicted);
          if (!freedSome) {
            ooms++;
            throw exhausted(size, "device memory exhausted (" + e.getMessage() + ")");
          }
          allocRetries++;
          retried = true;
        } finally {
          lock.unlock();
          evicted.run();
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

      lock.lock();
      try {
        inFlightBytes -= segmentBytes;
        backendAllocs++;
        if (!closed) {
          Segment segment = new Segment(nextSegmentId++, memory, SizeClasses.isSmall(size));
          Block whole = new Block(segment, nextBlockId++, 0, segmentBytes, Block.State.FREE);
          segment.head = whole;
          liveSegments.put(segment.id, segment);
          reservedBytes += segmentBytes;
          Block block = carve(whole, size, holder);
          block.hit = false;
          misses++;
          if (log.isDebugEnabled()) {
            log.debug("device {}: new segment {} of {} bytes for a {}-byte block",
                device.ordinal(), segment.id, segmentBytes, size);
          }
          return block;
        }
        backendFrees++;
      } finally {
        lock.unlock();
      }
      // Lost a race with close(): nobody will ever free this segment but us (outside the lock,
      // like every backend call).
      backend.free(memory);
      throw closedException();
    }
  }

  private boolean fitsBudgetOnceUnmapped(long segmentBytes) {
    return reservedBytes - awaitingUnmapBytes + inFlightBytes + segmentBytes <= limitBytes;
  }

  /** Waits until the allocation fits, no more unmaps are pending, or the deadline passes. */
  private void awaitUnmaps(long segmentBytes, long deadline) {
    lock.lock();
    try {
      long remaining = deadline - System.nanoTime();
      while (!closed && !fitsBudget(segmentBytes) && awaitingUnmapBytes > 0 && remaining > 0) {
        remaining = segmentFreed.awaitNanos(remaining);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      lock.unlock();
    }
  }

  private boolean fitsBudget(long segmentBytes) {
    return reservedBytes + inFlightBytes + segmentBytes <= limitBytes;
  }

  /** Takes the best-fitting cached block, or null. */
  private Block takeCached(long size, String holder) {
    assert lock.isHeldByCurrentThread();
    boolean small = SizeClasses.isSmall(size);
    TreeSet<Block> index = small ? smallFree : largeFree;
    probe.size = size;
    Block block = index.ceiling(probe);
    if (block == null || (!small && block.size > size + maxOversizeBytes)) {
      return null;
    }
    index.remove(block);
    Block leased = carve(block, size, holder);
    leased.hit = true;
    return leased;
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
      indexOf(segment).add(rest);
    }
    if (idleSegments.remove(segment)) {
      cachedBytes -= segment.bytes;
    }
    block.state = Block.State.LEASED;
    segment.usedBytes += block.size;
    leasedBytes += block.size;
    activeLeases++;
    if (leasedBytes > peakLeasedBytes) {
      peakLeasedBytes = leasedBytes;
    }
    if (segment.mappers.add(holder)) {
      segmentsByHolder.computeIfAbsent(holder, h -> new HashSet<>()).add(segment);
    }
    return block;
  }

  private TreeSet<Block> indexOf(Segment segment) {
    return segment.small ? smallFree : largeFree;
  }

  // ----------------------------------------------------------------------------- releasing

  /**
   * Returns a leased block. With a completion event the block is reused only once the event
   * has completed; the pool owns and closes the event.
   */
  public void release(Block block, CompletionEvent event) {
    AfterUnlock after = new AfterUnlock();
    lock.lock();
    try {
      if (block.state != Block.State.LEASED) {
        throw new IllegalStateException("release of a block that is not leased: " + block);
      }
      leasedBytes -= block.size;
      activeLeases--;
      if (event != null && !closed) {
        block.state = Block.State.AWAITING_EVENT;
        awaitingEventBytes += block.size;
        awaitingEvent.add(new PendingRelease(block, event));
        event = null; // now owned by awaitingEvent
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

  /** Puts a no-longer-used block back: coalesce, index, cache the segment if idle, apply the cap. */
  private void returnToCache(Block block, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    Segment segment = block.segment;
    block.state = Block.State.FREE;
    segment.usedBytes -= block.size;
    if (segment.state != Segment.State.LIVE) {
      return; // the pool was closed under it
    }
    TreeSet<Block> index = indexOf(segment);
    Block prev = block.prev;
    if (prev != null && prev.state == Block.State.FREE) {
      index.remove(prev);
      prev.size += block.size;
      unlink(block);
      block = prev;
    }
    Block next = block.next;
    if (next != null && next.state == Block.State.FREE) {
      index.remove(next);
      block.size += next.size;
      unlink(next);
    }
    index.add(block);
    if (segment.idle()) {
      idleSegments.add(segment);
      cachedBytes += segment.bytes;
      enforceCap(retentionCapBytes, after);
    }
    if (segment.state == Segment.State.LIVE) {
      returns++;
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
   * Checks completion events of released blocks and returns those that completed. Called
   * periodically by the server while {@link #hasAwaitingEvents()}.
   */
  public void pollEvents() {
    List<PendingRelease> pending;
    lock.lock();
    try {
      if (awaitingEvent.isEmpty()) {
        return;
      }
      pending = new ArrayList<>(awaitingEvent);
    } finally {
      lock.unlock();
    }
    List<PendingRelease> done = new ArrayList<>();
    for (PendingRelease p : pending) {
      boolean complete;
      try {
        complete = p.event.isComplete();
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
    AfterUnlock after = new AfterUnlock();
    lock.lock();
    try {
      // One pass over the pending list (removing one by one would be quadratic when
      // thousands of events are pending).
      Set<PendingRelease> completed = new HashSet<>(done);
      awaitingEvent.removeIf(p -> {
        if (!completed.contains(p)) {
          return false;
        }
        if (p.block.state == Block.State.AWAITING_EVENT) {
          awaitingEventBytes -= p.block.size;
          returnToCache(p.block, after);
        }
        return true;
      });
    } finally {
      lock.unlock();
      after.run();
    }
    done.forEach(p -> p.event.close());
  }

  /** True when released blocks wait for completion events; cheap enough to poll often. */
  public boolean hasAwaitingEvents() {
    lock.lock();
    try {
      return !awaitingEvent.isEmpty();
    } finally {
      lock.unlock();
    }
  }

  // ------------------------------------------------------------------------------ eviction

  /**
   * Sets the retention cap and evicts at once down to it.
   *
   * @return bytes of segments evicted
   */
  public long setRetentionCap(long capBytes) {
    AfterUnlock after = new AfterUnlock();
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
   * Evicts cached segments, least recently used first, until at most {@code keepBytes} remain.
   *
   * @return bytes of segments evicted
   */
  public long trim(long keepBytes) {
    AfterUnlock after = new AfterUnlock();
    lock.lock();
    try {
      return enforceCap(keepBytes, after);
    } finally {
      lock.unlock();
      after.run();
    }
  }

  private long enforceCap(long cap, AfterUnlock after) {
    long evicted = 0;
    Iterator<Segment> lru = idleSegments.iterator();
    while (cachedBytes > cap && lru.hasNext()) {
      Segment segment = lru.next();
      lru.remove();
      evicted += evict(segment, after);
    }
    return evicted;
  }

  /** Evicts idle segments until the allocation fits; true if anything was evicted. */
  private boolean evictUntilFits(long segmentBytes, AfterUnlock after) {
    // Evicting only helps if what can be freed at once would make room.
    if (reservedBytes - cachedBytes + inFlightBytes + segmentBytes > limitBytes) {
      return false;
    }
    boolean any = false;
    Iterator<Segment> lru = idleSegments.iterator();
    while (!fitsBudget(segmentBytes) && lru.hasNext()) {
      Segment segment = lru.next();
      lru.remove();
      evict(segment, after);
      any = true;
    }
    return any;
  }

  private boolean evictAllIdle(AfterUnlock after) {
    return enforceCap(0, after) > 0;
  }

  /** Evicts one idle segment (already removed from the LRU list). */
  private long evict(Segment segment, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    Block whole = segment.head;
    assert whole.state == Block.State.FREE && whole.next == null && whole.size == segment.bytes
        : "evicting a segment that is not wholly free: " + segment;
    indexOf(segment).remove(whole);
    liveSegments.remove(segment.id);
    cachedBytes -= segment.bytes;
    evictions++;
    if (segment.mappers.isEmpty()) {
      segment.state = Segment.State.FREED;
      reservedBytes -= segment.bytes;
      backendFrees++;
      after.free(segment);
    } else {
      segment.state = Segment.State.AWAITING_UNMAP;
      awaitingUnmap.put(segment.id, segment);
      awaitingUnmapBytes += segment.bytes;
      for (String holder : segment.mappers) {
        after.askUnmap(holder, segment.id);
      }
    }
    return segment.bytes;
  }

  // ------------------------------------------------------------------------------ holders

  /**
   * A holder confirms it has unmapped a segment. Only segments the pool asked for are
   * affected: a live segment may be handed to the holder again at any time, so its mapping
   * state is not trusted to a message that could cross a new lease in flight.
   */
  public void unmapped(String holder, long segmentId) {
    AfterUnlock after = new AfterUnlock();
    lock.lock();
    try {
      Segment segment = awaitingUnmap.get(segmentId);
      if (segment != null) {
        dropMapper(segment, holder, after);
        Set<Segment> held = segmentsByHolder.get(holder);
        if (held != null) {
          held.remove(segment);
        }
      }
    } finally {
      lock.unlock();
      after.run();
    }
  }

  /** A holder ended: it maps nothing any more. */
  public void holderEnded(String holder) {
    AfterUnlock after = new AfterUnlock();
    lock.lock();
    try {
      Set<Segment> held = segmentsByHolder.remove(holder);
      if (held != null) {
        for (Segment segment : held) {
          dropMapper(segment, holder, after);
        }
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
      Set<Segment> held = segmentsByHolder.get(holder);
      if (held == null) {
        return List.of();
      }
      List<Long> ids = new ArrayList<>();
      for (Segment segment : held) {
        if (segment.state == Segment.State.AWAITING_UNMAP) {
          ids.add(segment.id);
        }
      }
      return ids;
    } finally {
      lock.unlock();
    }
  }

  /** Number of segments a holder may have mapped. */
  public int mappedSegments(String holder) {
    lock.lock();
    try {
      Set<Segment> held = segmentsByHolder.get(holder);
      return held == null ? 0 : held.size();
    } finally {
      lock.unlock();
    }
  }

  private void dropMapper(Segment segment, String holder, AfterUnlock after) {
    if (segment.mappers.remove(holder) && segment.mappers.isEmpty()
        && segment.state == Segment.State.AWAITING_UNMAP) {
      awaitingUnmap.remove(segment.id);
      awaitingUnmapBytes -= segment.bytes;
      reservedBytes -= segment.bytes;
      segmentFreed.signalAll();
      segment.state = Segment.State.FREED;
      backendFrees++;
      after.free(segment);
    }
  }

  // ------------------------------------------------------------------------------ reporting

  public PoolStats stats() {
    lock.lock();
    try {
      long cachedBlocks = smallFree.size() + largeFree.size();
      long remainder = remainderBytes();
      return new PoolStats(device.ordinal(), hits, misses, returns, evictions, allocRetries, ooms,
          leasedBytes, cachedBytes, reservedBytes, peakLeasedBytes, activeLeases, cachedBlocks,
          liveSegments.size(), retentionCapBytes, device.capacityBytes(), limitBytes, remainder,
          backendAllocs, backendFrees, awaitingUnmap.size(), awaitingUnmapBytes,
          awaitingEvent.size(), awaitingEventBytes);
    } finally {
      lock.unlock();
    }
  }

  /** Free bytes inside segments that also hold leases (split remainders). */
  private long remainderBytes() {
    assert lock.isHeldByCurrentThread();
    return reservedBytes - leasedBytes - cachedBytes - awaitingEventBytes - awaitingUnmapBytes;
  }

  private ExhaustedException exhausted(long size, String why) {
    // Built only on the failure path.
    long remainder = remainderBytes();
    return new ExhaustedException("device " + device.ordinal() + ": cannot lease "
        + SizeClasses.format(size) + ": " + why + " (requested=" + size + ", leased=" + leasedBytes
        + ", cached=" + cachedBytes + ", remainder=" + remainder + ", awaiting_event="
        + awaitingEventBytes + ", awaiting_unmap=" + awaitingUnmapBytes + ", in_flight="
        + inFlightBytes + ", limit=" + limitBytes + ")");
  }

  /**
   * Checks the pool's structure; for tests. Throws {@link AssertionError} describing the first
   * violation: blocks tile each segment, free neighbours are coalesced, indexes and byte
   * counters agree with the blocks.
   */
  public void verifyInvariants() {
    lock.lock();
    try {
      long segBytes = 0;
      long leased = 0;
      long cached = 0;
      long awaitingEv = 0;
      long freeBlocks = 0;
      long leasedCount = 0;
      for (Segment s : liveSegments.values()) {
        check(s.state == Segment.State.LIVE, "live segment in state " + s.state);
        segBytes += s.bytes;
        long expectOffset = 0;
        long used = 0;
        Block prev = null;
        for (Block b = s.head; b != null; b = b.next) {
          check(b.prev == prev, "broken prev link at " + b);
          check(b.offset == expectOffset, "gap or overlap at " + b + " (expected offset " + expectOffset + ")");
          check(b.size > 0 && b.size % SizeClasses.ALIGNMENT == 0, "bad size " + b);
          expectOffset += b.size;
          switch (b.state) {
            case FREE -> {
              check(indexOf(s).contains(b), "free block not indexed: " + b);
              check(prev == null || prev.state != Block.State.FREE, "uncoalesced free neighbours at " + b);
              freeBlocks++;
            }
            case LEASED -> {
              leased += b.size;
              leasedCount++;
              used += b.size;
            }
            case AWAITING_EVENT -> {
              awaitingEv += b.size;
              used += b.size;
            }
          }
          prev = b;
        }
        check(expectOffset == s.bytes, "blocks do not cover " + s);
        check(used == s.usedBytes, "used bytes " + s.usedBytes + " != " + used + " in " + s);
        check(s.idle() == idleSegments.contains(s), "idle list disagrees for " + s);
        if (s.idle()) {
          cached += s.bytes;
        }
      }
      check(idleSegments.size() <= liveSegments.size(), "idle list holds dead segments");
      for (Segment s : awaitingUnmap.values()) {
        segBytes += s.bytes;
        check(!s.mappers.isEmpty(), "awaiting-unmap segment without mappers: " + s);
      }
      check(freeBlocks == smallFree.size() + largeFree.size(), "index holds blocks that are not free");
      check(segBytes == reservedBytes, "reserved " + reservedBytes + " != segments " + segBytes);
      check(leased == leasedBytes, "leased " + leasedBytes + " != blocks " + leased);
      check(leasedCount == activeLeases, "active leases " + activeLeases + " != " + leasedCount);
      check(cached == cachedBytes, "cached " + cachedBytes + " != idle segments " + cached);
      check(awaitingEv == awaitingEventBytes, "awaiting-event bytes disagree");
      check(reservedBytes <= limitBytes, "reserved " + reservedBytes + " over limit " + limitBytes);
    } finally {
      lock.unlock();
    }
  }

  private static void check(boolean condition, String message) {
    if (!condition) {
      throw new AssertionError("pool invariant: " + message);
    }
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
    List<PendingRelease> events;
    lock.lock();
    try {
      if (closed) {
        return;
      }
      closed = true;
      all.addAll(liveSegments.values());
      all.addAll(awaitingUnmap.values());
      liveSegments.clear();
      awaitingUnmap.clear();
      idleSegments.clear();
      smallFree.clear();
      largeFree.clear();
      events = new ArrayList<>(awaitingEvent);
      awaitingEvent.clear();
      for (Segment s : all) {
        s.state = Segment.State.FREED;
      }
    } finally {
      lock.unlock();
    }
    events.forEach(p -> p.event.close());
    for (Segment s : all) {
      backend.free(s.memory);
    }
    lock.lock();
    try {
      backendFrees += all.size();
      reservedBytes = 0;
      cachedBytes = 0;
      awaitingUnmapBytes = 0;
      awaitingEventBytes = 0;
    } finally {
      lock.unlock();
    }
  }

  /**
   * Work found under the lock that must run after it is released: backend frees and unmap
   * requests. Owned by one thread at a time.
   */
  private final class AfterUnlock {
    private List<Segment> toFree;
    private List<Object[]> unmaps;

    void free(Segment segment) {
      if (toFree == null) {
        toFree = new ArrayList<>(2);
      }
      toFree.add(segment);
    }

    void askUnmap(String holder, long segmentId) {
      if (unmaps == null) {
        unmaps = new ArrayList<>(2);
      }
      unmaps.add(new Object[] {holder, segmentId});
    }

    void run() {
      if (toFree != null) {
        for (Segment segment : toFree) {
          backend.free(segment.memory);
          if (log.isDebugEnabled()) {
            log.debug("device {}: freed segment {} ({} bytes)", device.ordinal(), segment.id, segment.bytes);
          }
        }
      }
      if (unmaps != null) {
        for (Object[] u : unmaps) {
          unmapRequester.requestUnmap((String) u[0], device.ordinal(), (Long) u[1]);
        }
      }
    }
  }
}
