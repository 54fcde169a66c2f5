package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.pool.CheckedPool.UnmapRequest;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * Rule 2: a segment is never freed while a holder may still have it mapped. Evicting such a
 * segment asks its holders to unmap it and frees it once every one has confirmed or ended.
 * Also: {@link DevicePool#close()} frees everything whatever its state.
 */
class DevicePoolUnmapTest extends PoolTestBase {

  @Test
  void evict_ofSegmentMappedByAHolder_waitsForItsUnmap() {
    Block a = lease(4096, false, "h1");
    release(a);

    assertEquals(2 * MiB, pool.trim(0));

    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state);
    assertTrue(backend.isLive(a.memory()), "not freed while h1 may have it mapped");
    assertEquals(List.of(new UnmapRequest("h1", 0, a.segmentId())), checked.unmapRequests());
    PoolStats s = stats();
    assertEquals(0, s.get(PoolMetric.SEGMENTS));
    assertEquals(1, s.get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(2 * MiB, s.get(PoolMetric.AWAITING_UNMAP_BYTES));
    assertEquals(2 * MiB, s.get(PoolMetric.RESERVED_BYTES));
    assertEquals(0, s.get(PoolMetric.CACHED_BYTES));
    assertEquals(1, s.get(PoolMetric.EVICTIONS));
    checked.verify();

    pool.unmapped("h1", a.segmentId());

    assertEquals(Segment.State.FREED, a.segment.state);
    assertFalse(backend.isLive(a.memory()));
    assertEquals(0, stats().get(PoolMetric.RESERVED_BYTES));
    assertEquals(0, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(0, pool.mappedSegments("h1"));
  }

  @Test
  void evict_ofSegmentMappedByTwoHolders_freesItOnlyAfterBoth() {
    Block a = lease(4096, false, "h1");
    Block b = lease(4096, false, "h2");
    assertEquals(a.segmentId(), b.segmentId());
    release(a);
    release(b);
    pool.trim(0);
    Set<String> asked = checked.unmapRequests().stream().map(UnmapRequest::holder).collect(Collectors.toSet());
    assertEquals(Set.of("h1", "h2"), asked);

    pool.unmapped("h1", a.segmentId());
    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state, "h2 may still have it mapped");
    assertTrue(backend.isLive(a.memory()));

    pool.holderEnded("h2"); // a session that ends unmaps everything

    assertEquals(Segment.State.FREED, a.segment.state);
    assertFalse(backend.isLive(a.memory()));
  }

  @Test
  void unmapped_forALiveSegment_isIgnored() {
    Block a = lease(4096, false, "h1");

    pool.unmapped("h1", a.segmentId()); // a stray message that crossed a new lease

    assertEquals(1, pool.mappedSegments("h1"));
    release(a);
    pool.trim(0);
    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state, "h1 is still asked to unmap");
    assertEquals(List.of(new UnmapRequest("h1", 0, a.segmentId())), checked.unmapRequests());
    pool.unmapped("h1", a.segmentId());
    assertEquals(Segment.State.FREED, a.segment.state);
  }

  @Test
  void unmapped_byAHolderThatNeverMappedTheSegment_changesNothing() {
    Block a = lease(4096, false, "h1");
    release(a);
    pool.trim(0);

    pool.unmapped("stranger", a.segmentId());
    pool.unmapped("h1", 12345); // no such segment

    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state);
    pool.unmapped("h1", a.segmentId());
    pool.unmapped("h1", a.segmentId()); // a repeat is harmless
    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(1, backend.frees());
  }

  @Test
  void holderEnded_freesTheSegmentsAwaitingOnlyIt_andForgetsItsMappings() {
    Block small = lease(4096, false, "h1");
    Block large = lease(4 * MiB, false, "h1");
    Block kept = lease(8 * MiB, false, "h1");
    release(small);
    release(large);
    assertEquals(3, pool.mappedSegments("h1"));
    pool.trim(0);
    assertEquals(2, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));

    pool.holderEnded("h1");

    assertEquals(0, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(0, pool.mappedSegments("h1"));
    assertFalse(backend.isLive(small.memory()));
    assertFalse(backend.isLive(large.memory()));
    assertTrue(backend.isLive(kept.memory()), "still leased");
    // A segment the holder no longer maps is freed at once when evicted.
    release(kept);
    pool.trim(0);
    assertEquals(Segment.State.FREED, kept.segment.state);
  }

  @Test
  void retentionCap_evictionOfAMappedSegment_asksForUnmapToo() {
    use(64 * MiB, 64 * MiB, 0, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(4096, false, "h1");

    release(a);

    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state);
    assertEquals(List.of(new UnmapRequest("h1", 0, a.segmentId())), checked.unmapRequests());
    pool.holderEnded("h1");
    assertEquals(Segment.State.FREED, a.segment.state);
  }

  @Test
  void budgetEviction_ofMappedSegments_failsNowAndSucceedsOnceUnmapped() {
    use(64 * MiB, 4 * MiB, 4 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(2 * MiB, false, "h1");
    release(a);

    // The only way to make room is a segment h1 still maps: asked to unmap, but not free yet.
    assertThrows(ExhaustedException.class, () -> pool.lease(4 * MiB, false, "h2", SegmentOwner.DAEMON));
    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state);
    assertEquals(List.of(new UnmapRequest("h1", 0, a.segmentId())), checked.unmapRequests());
    assertEquals(1, stats().get(PoolMetric.OOMS));

    pool.unmapped("h1", a.segmentId());
    Block b = lease(4 * MiB, false, "h2");
    assertFalse(hit(b));
  }

  @Test
  void aSegmentAwaitingUnmap_isNeverLeasedAgain() {
    Block a = lease(4096, false, "h1");
    release(a);
    pool.trim(0);

    Block b = lease(4096, false, "h2");

    assertFalse(hit(b));
    assertFalse(a.segmentId() == b.segmentId());
    pool.holderEnded("h1");
  }

  @Test
  void mappedSegments_countsEachSegmentOnce() {
    lease(4096, false, "h1");
    lease(4096, false, "h1");
    lease(4 * MiB, false, "h1");
    assertEquals(2, pool.mappedSegments("h1"));
    assertEquals(0, pool.mappedSegments("nobody"));
  }

  // ---------------------------------------------------------------------------------- close

  @Test
  void close_freesEverythingWhateverItsState() {
    Block leased = lease(4096, false, "h1");
    Block awaitingEvent = lease(4 * MiB, false, "h1");
    checked.release(awaitingEvent, backend.newEvent());
    Block awaitingUnmap = lease(8 * MiB, false, "h2");
    release(awaitingUnmap);
    pool.trim(0);
    release(lease(16 * MiB)); // cached
    assertEquals(1, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(4, backend.liveSegments());

    pool.close();

    assertEquals(0, backend.liveSegments());
    assertTrue(backend.events().get(0).closed(), "pending events are closed");
    assertThrows(IllegalStateException.class, () -> pool.lease(4096, false, "h1", SegmentOwner.DAEMON));
    assertThrows(IllegalStateException.class, () -> pool.tryLeaseCached(4096, "h1", SegmentOwner.DAEMON));
    pool.close(); // idempotent
    // Releasing after close is harmless and settles the books.
    release(leased);
    assertEquals(0, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(0, stats().get(PoolMetric.RESERVED_BYTES));
    pool.pollEvents();
    pool.unmapped("h2", awaitingUnmap.segmentId());
    pool.holderEnded("h1");
  }

  @Test
  void close_releaseWithAnEventAfterwards_closesTheEvent() {
    Block a = lease(4096, false, "h1");
    pool.close();
    InMemoryBackend.FakeEvent event = backend.newEvent();

    checked.release(a, event);

    assertTrue(event.closed(), "the pool owns the event it was given and must close it");
    assertFalse((pool.stats().get(PoolMetric.BLOCKS_AWAITING_EVENT) > 0));
  }

  @Test
  void close_racingANewSegment_freesItAndCountsTheFree() {
    // close() lands while the pool is outside its lock allocating a segment.
    backend.onAllocate(() -> {
      backend.onAllocate(null);
      pool.close();
    });

    assertThrows(IllegalStateException.class, () -> pool.lease(4096, false, "h1", SegmentOwner.DAEMON));

    assertEquals(List.of(), backend.errors(), "the free runs outside the pool lock");
    assertEquals(0, backend.liveSegments(), "the segment allocated for the lost race is freed");
    assertEquals(1, backend.frees());
    assertEquals(backend.frees(), stats().get(PoolMetric.BACKEND_FREES), "the pool counts that free");
    assertEquals(0, stats().get(PoolMetric.RESERVED_BYTES));
  }
}
