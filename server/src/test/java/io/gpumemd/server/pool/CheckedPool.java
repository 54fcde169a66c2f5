package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.SegmentOwner;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A {@link DevicePool} on an {@link InMemoryBackend} with the test's own bookkeeping, so that
 * {@link #verify()} can check after every test what the pool claims against what the test did
 * and what the backend saw:
 *
 * <ul>
 *   <li>the pool's own structure ({@link DevicePool#verifyInvariants()});
 *   <li>every successful lease is a hit or a miss: {@code hits + misses == leases made};
 *   <li>every completed release is a return or an eviction of its own segment (checked at each
 *       release in single-threaded use, summed in {@link #verify()});
 *   <li>{@code reserved = leased + client_cached + cached + remainder + awaiting_event +
 *       awaiting_unmap}, each
 *       term recomputed from the segments the test has seen;
 *   <li>backend allocations, frees and live segments agree with the pool's counters;
 *   <li>no backend call is made with the pool lock held (checked at each call).
 * </ul>
 *
 * <p>{@link #lease(long)} leases for a fresh anonymous holder that ends (unmaps everything) as
 * soon as its block is released, as a client that unmaps on release would; the other lease
 * methods take a named holder, which lives until the test ends it. Unmap requests are recorded
 * ({@link #unmapRequests()}).
 *
 * <p>Thread-safe enough for the concurrency test: every piece of bookkeeping is concurrent; the
 * per-release exactness checks run only when constructed with {@code exact} (one thread).
 */
final class CheckedPool implements AutoCloseable {
  static final long KiB = 1024;
  static final long MiB = 1024 * KiB;

  /** One call of the {@link HolderRequests}. */
  record UnmapRequest(String holder, int device, long segmentId) {}

  final InMemoryBackend backend;
  final DevicePool pool;
  private final boolean exact;
  private final AtomicLong anonymous = new AtomicLong();
  private final AtomicLong leases = new AtomicLong();
  private final AtomicLong releasesCompleted = new AtomicLong();
  private final AtomicLong returnsSeen = new AtomicLong();
  private final AtomicLong evictedOnRelease = new AtomicLong();
  private final Set<Segment> seen = ConcurrentHashMap.newKeySet();
  private final Map<Block, String> anonymousHolders = Collections.synchronizedMap(new IdentityHashMap<>());
  private final Map<Block, Boolean> hits = Collections.synchronizedMap(new IdentityHashMap<>());
  private final List<Block> awaitingEvent = new CopyOnWriteArrayList<>();
  private final List<CompletionEvent> eventsGiven = new CopyOnWriteArrayList<>();
  private final List<UnmapRequest> unmapRequests = new CopyOnWriteArrayList<>();
  private volatile RecordingHolders.UnmapListener unmapListener;
  final RecordingHolders holders = new RecordingHolders();

  CheckedPool(InMemoryBackend backend, PoolSettings settings) {
    this(backend, settings, true);
  }

  CheckedPool(InMemoryBackend backend, PoolSettings settings, boolean exact) {
    this.backend = backend;
    this.exact = exact;
    holders.onUnmap((holder, device, segmentId) -> {
      unmapRequests.add(new UnmapRequest(holder, device, segmentId));
      RecordingHolders.UnmapListener listener = unmapListener;
      if (listener != null) {
        listener.requestUnmap(holder, device, segmentId);
      }
    });
    this.pool = new DevicePool(backend.devices().get(0), backend, settings, holders,
        DevicePools.segmentIdBase(0), Ticker.system());
    ReentrantLock lock = pool.core.lock;
    backend.checkEveryCall(() -> lock.isHeldByCurrentThread()
        ? "called with the pool lock held (backend calls must run outside it)" : null);
  }

  /** Default settings: budget = capacity, retention cap = capacity, oversize 20 MiB. */
  static CheckedPool of(long capacityBytes) {
    return new CheckedPool(new InMemoryBackend(1, capacityBytes, true),
        new PoolSettings(capacityBytes, capacityBytes, SizeClasses.DEFAULT_MAX_OVERSIZE));
  }

  /** Also forwards unmap requests to {@code listener} (called outside the pool lock). */
  void onUnmapRequest(RecordingHolders.UnmapListener listener) {
    this.unmapListener = listener;
  }

  // ------------------------------------------------------------------------------ leasing

  /** Leases for an anonymous holder that ends when the block is released. */
  Block lease(long size) {
    String holder = "anon-" + anonymous.incrementAndGet();
    Block block = lease(size, false, holder);
    anonymousHolders.put(block, holder);
    return block;
  }

  Block lease(long size, boolean zero, String holder) {
    return lease(size, zero, holder, SegmentOwner.DAEMON);
  }

  Block lease(long size, boolean zero, String holder, SegmentOwner owner) {
    return leased(pool.lease(size, zero, holder, owner));
  }

  /** {@link DevicePool#tryLeaseCached} for the daemon, counted when it leases. */
  Block tryLeaseCached(long size, String holder) {
    return tryLeaseCached(size, holder, SegmentOwner.DAEMON);
  }

  /** {@link DevicePool#tryLeaseCached}, counted when it leases. */
  Block tryLeaseCached(long size, String holder, SegmentOwner owner) {
    LeasedBlock leased = pool.tryLeaseCached(size, holder, owner);
    if (leased == null) {
      return null;
    }
    assertTrue(leased.poolHit(), "tryLeaseCached returned a block that is not a hit");
    return leased(leased);
  }

  /** Whether the lease that handed out {@code block} (its latest) was a pool hit. */
  boolean wasHit(Block block) {
    Boolean hit = hits.get(block);
    if (hit == null) {
      throw new AssertionError("never leased through this CheckedPool: " + block);
    }
    return hit;
  }

  private Block leased(LeasedBlock leased) {
    Block block = leased.block();
    hits.put(block, leased.poolHit());
    recordLease(block);
    return block;
  }

  private void recordLease(Block block) {
    leases.incrementAndGet();
    seen.add(block.segment);
    assertEquals(Segment.State.LIVE, block.segment.state, "leased from a segment that is not live");
  }

  // ---------------------------------------------------------------------------- releasing

  /** Releases without an event; checks it was a return or the eviction of its segment. */
  void release(Block block) {
    PoolStats before = exact ? pool.stats() : null;
    Segment segment = block.segment;
    boolean wasLive = segment.state == Segment.State.LIVE;
    pool.release(block, null);
    if (!wasLive) {
      // After close(): the segment is already gone; the release only settles the books.
      assertTrue(!exact || pool.stats().get(PoolMetric.RETURNS) == before.get(PoolMetric.RETURNS), "a release after close is no return");
      endAnonymousHolder(block);
      return;
    }
    releasesCompleted.incrementAndGet();
    if (exact) {
      long returned = pool.stats().get(PoolMetric.RETURNS) - before.get(PoolMetric.RETURNS);
      boolean evicted = segment.state != Segment.State.LIVE;
      assertEquals(1, returned + (evicted ? 1 : 0),
          "a release must be exactly one return or the eviction of its segment (returns +" + returned
              + ", segment " + segment.state + ")");
      returnsSeen.addAndGet(returned);
      evictedOnRelease.addAndGet(evicted ? 1 : 0);
    }
    endAnonymousHolder(block);
  }

  /** Releases with a completion event; the block waits for it. */
  void release(Block block, CompletionEvent event) {
    pool.release(block, event);
    eventsGiven.add(event);
    awaitingEvent.add(block);
    endAnonymousHolder(block);
  }

  private void endAnonymousHolder(Block block) {
    String holder = anonymousHolders.remove(block);
    if (holder != null) {
      pool.holderEnded(holder);
    }
  }

  /** {@link DevicePool#pollEvents}, checking each completed release as {@link #release(Block)} does. */
  void pollEvents() {
    if (!exact) {
      pool.pollEvents();
      return;
    }
    List<Block> waiting = new ArrayList<>(awaitingEvent);
    Map<Block, Segment.State> segmentStates = new IdentityHashMap<>();
    waiting.forEach(b -> segmentStates.put(b, b.segment.state));
    PoolStats before = pool.stats();
    pool.pollEvents();
    long completed = 0;
    long evicted = 0;
    for (Block b : waiting) {
      if (b.state != Block.State.AWAITING_EVENT) {
        awaitingEvent.remove(b);
        completed++;
        if (segmentStates.get(b) == Segment.State.LIVE && b.segment.state != Segment.State.LIVE) {
          evicted++;
        }
      }
    }
    long returned = pool.stats().get(PoolMetric.RETURNS) - before.get(PoolMetric.RETURNS);
    assertEquals(completed, returned + evicted, "completed event releases vs returns + evictions");
    releasesCompleted.addAndGet(completed);
    returnsSeen.addAndGet(returned);
    evictedOnRelease.addAndGet(evicted);
  }

  /**
   * Accounts for leases the pool served and took back itself (a failed zeroing): each counted
   * as a hit or miss and as a return, though the test never got the block.
   */
  void countServedAndReturnedByPool(long count) {
    leases.addAndGet(count);
    releasesCompleted.addAndGet(count);
    returnsSeen.addAndGet(count);
  }

  List<UnmapRequest> unmapRequests() {
    return List.copyOf(unmapRequests);
  }

  long leasesMade() {
    return leases.get();
  }

  PoolStats stats() {
    return pool.stats();
  }

  // ------------------------------------------------------------------------------ checking

  /** Every check of the class javadoc; throws on the first violation. */
  void verify() {
    pool.verifyInvariants();
    PoolStats s = pool.stats();
    assertEquals(leases.get(), s.get(PoolMetric.HITS) + s.get(PoolMetric.MISSES),
        "every successful lease is a hit or a miss (hits=" + s.get(PoolMetric.HITS) + ", misses=" + s.get(PoolMetric.MISSES) + ")");
    if (exact) {
      assertEquals(returnsSeen.get(), s.get(PoolMetric.RETURNS), "returns counted by the pool vs seen at release");
      assertEquals(releasesCompleted.get(), returnsSeen.get() + evictedOnRelease.get(),
          "every completed release is a return or an eviction of its segment");
      assertTrue(s.get(PoolMetric.EVICTIONS) >= evictedOnRelease.get(), "evictions include those caused by releases");
    }

    // Byte accounting, recomputed from the segments' blocks.
    long reserved = 0;
    long leased = 0;
    long cached = 0;
    long remainder = 0;
    long awaitingEv = 0;
    long awaitingUnmap = 0;
    long clientCached = 0;
    long liveCount = 0;
    long awaitingUnmapCount = 0;
    long activeLeases = 0;
    long freeBlocks = 0;
    for (Segment segment : seen) {
      if (segment.state == Segment.State.FREED) {
        assertTrue(!backend.isLive(segment.memory), "pool freed " + segment + " but the backend still holds it");
        continue;
      }
      assertTrue(backend.isLive(segment.memory), segment + " is not freed but the backend has no such segment");
      reserved += segment.bytes;
      if (segment.state == Segment.State.AWAITING_UNMAP) {
        awaitingUnmap += segment.bytes;
        awaitingUnmapCount++;
        continue;
      }
      liveCount++;
      if (segment.idle()) {
        cached += segment.bytes;
        freeBlocks++;
        continue;
      }
      for (Block b = segment.head; b != null; b = b.next) {
        switch (b.state) {
          case FREE -> {
            remainder += b.size;
            freeBlocks++;
          }
          case LEASED -> {
            leased += b.size;
            activeLeases++;
          }
          case CLIENT_CACHED -> clientCached += b.size;
          case AWAITING_EVENT -> awaitingEv += b.size;
        }
      }
    }
    assertEquals(s.get(PoolMetric.RESERVED_BYTES), s.get(PoolMetric.LEASED_BYTES) + s.get(PoolMetric.CLIENT_CACHED_BYTES)
        + s.get(PoolMetric.CACHED_BYTES) + s.get(PoolMetric.REMAINDER_BYTES)
        + s.get(PoolMetric.AWAITING_EVENT_BYTES) + s.get(PoolMetric.AWAITING_UNMAP_BYTES),
        "reserved = leased + client_cached + cached + remainder + awaiting_event + awaiting_unmap");
    assertTrue(s.get(PoolMetric.REMAINDER_BYTES) >= 0, "negative remainder " + s.get(PoolMetric.REMAINDER_BYTES));
    if (seen.size() == backend.allocs()) {
      // The test saw every segment the pool allocated: the figures must match exactly.
      assertEquals(reserved, s.get(PoolMetric.RESERVED_BYTES), "reserved bytes");
      assertEquals(leased, s.get(PoolMetric.LEASED_BYTES), "leased bytes");
      assertEquals(cached, s.get(PoolMetric.CACHED_BYTES), "cached bytes");
      assertEquals(remainder, s.get(PoolMetric.REMAINDER_BYTES), "remainder bytes");
      assertEquals(awaitingEv, s.get(PoolMetric.AWAITING_EVENT_BYTES), "awaiting-event bytes");
      assertEquals(clientCached, s.get(PoolMetric.CLIENT_CACHED_BYTES), "client-cached bytes");
      assertEquals(awaitingUnmap, s.get(PoolMetric.AWAITING_UNMAP_BYTES), "awaiting-unmap bytes");
      assertEquals(liveCount, s.get(PoolMetric.SEGMENTS), "live segments");
      assertEquals(awaitingUnmapCount, s.get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "segments awaiting unmap");
      assertEquals(activeLeases, s.get(PoolMetric.ACTIVE_LEASES), "active leases");
      assertEquals(freeBlocks, s.get(PoolMetric.CACHED_BLOCKS), "cached blocks");
    }

    // The backend agrees with the pool.
    assertEquals(backend.allocs(), s.get(PoolMetric.BACKEND_ALLOCS), "backend allocations");
    assertEquals(backend.frees(), s.get(PoolMetric.BACKEND_FREES), "backend frees");
    assertEquals(backend.allocs() - backend.frees(), s.get(PoolMetric.SEGMENTS) + s.get(PoolMetric.SEGMENTS_AWAITING_UNMAP),
        "backend allocs - frees == live segments + segments awaiting unmap");
    assertEquals(backend.liveBytes(), s.get(PoolMetric.RESERVED_BYTES), "backend bytes vs reserved");
    assertTrue(s.get(PoolMetric.RESERVED_BYTES) <= s.get(PoolMetric.LIMIT_BYTES), "reserved over the budget");
    assertEquals(List.of(), backend.errors(), "backend misuse");
  }

  /** Closes the pool and checks that the backend holds nothing any more. */
  @Override
  public void close() {
    pool.close();
    assertEquals(0, backend.liveSegments(), "segments left in the backend after close");
    assertEquals(backend.allocs(), backend.frees(), "backend allocs vs frees after close");
    PoolStats s = pool.stats();
    assertEquals(backend.frees(), s.get(PoolMetric.BACKEND_FREES), "pool's backend frees after close");
    assertEquals(List.of(), backend.errors(), "backend misuse");
    for (CompletionEvent event : eventsGiven) {
      if (event instanceof InMemoryBackend.FakeEvent fake) {
        assertTrue(fake.closed(), "the pool owns the events it was given and closes them");
      }
    }
  }
}
