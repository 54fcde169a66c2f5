package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * What the pool gives back and when: the retention cap, trims, the device budget and the
 * backend running out of memory or failing. Holders here are anonymous (they unmap on
 * release), so evicted segments are freed at once; the README's rule 2 (unmap before free) has
 * its own test class, DevicePoolUnmapTest.
 */
class DevicePoolEvictionTest extends PoolTestBase {

  // --------------------------------------------------------------------------- retention cap

  @Test
  void release_pastRetentionCap_evictsTheLeastRecentlyIdleSegment() {
    use(64 * MiB, 64 * MiB, 4 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(2 * MiB);
    Block b = lease(2 * MiB);
    Block c = lease(2 * MiB);

    release(b);
    release(a); // cached 4 MiB: at the cap, nothing evicted
    assertEquals(4 * MiB, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(0, stats().get(PoolMetric.EVICTIONS));
    release(c); // 6 MiB > 4 MiB: b has been idle longest

    assertEquals(Segment.State.FREED, b.segment.state);
    assertFalse(backend.isLive(b.memory()));
    assertTrue(backend.isLive(a.memory()));
    assertTrue(backend.isLive(c.memory()));
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.EVICTIONS));
    assertEquals(3, s.get(PoolMetric.RETURNS));
    assertEquals(4 * MiB, s.get(PoolMetric.CACHED_BYTES));
    assertEquals(2, s.get(PoolMetric.SEGMENTS));
    assertEquals(List.of(), checked.unmapRequests(), "anonymous holders unmapped on release");
  }

  @Test
  void release_pastRetentionCap_evictsByIdleTimeNotByAllocationOrder() {
    use(64 * MiB, 64 * MiB, 4 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(2 * MiB);
    Block b = lease(2 * MiB);
    Block c = lease(2 * MiB);
    release(a);
    release(b);
    Block again = lease(2 * MiB); // a hit on a (lower block id among equal sizes)
    assertEquals(a.segmentId(), again.segmentId());
    release(again); // a is now the most recently idle

    release(c);

    assertEquals(Segment.State.FREED, b.segment.state, "b has been idle longest");
    assertEquals(Segment.State.LIVE, a.segment.state);
    assertEquals(Segment.State.LIVE, c.segment.state);
  }

  @Test
  void release_ofTheSegmentItself_pastTheCap_isAnEvictionNotAReturn() {
    use(64 * MiB, 64 * MiB, 1 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(2 * MiB);

    release(a);

    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(0, stats().get(PoolMetric.RETURNS));
    assertEquals(1, stats().get(PoolMetric.EVICTIONS));
  }

  @Test
  void release_withCapZero_cachesNoWholeSegment() {
    use(64 * MiB, 64 * MiB, 0, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block only = lease(4096);
    release(only);
    assertEquals(Segment.State.FREED, only.segment.state);
    assertEquals(0, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(0, stats().get(PoolMetric.SEGMENTS));
    assertEquals(1, backend.frees());

    // Free blocks in a segment that still holds leases are not cached segments: they stay.
    Block b = lease(4096);
    Block c = lease(4096);
    assertFalse(hit(b));
    release(b);
    assertEquals(Segment.State.LIVE, b.segment.state);
    assertEquals(1, stats().get(PoolMetric.RETURNS));
    Block reuse = lease(4096);
    assertTrue(hit(reuse));
    release(reuse);
    release(c);
    assertEquals(Segment.State.FREED, c.segment.state);
    assertEquals(0, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(2, stats().get(PoolMetric.EVICTIONS));
  }

  @Test
  void setRetentionCap_lowering_evictsAtOnceAndReturnsTheBytes() {
    Block a = lease(2 * MiB);
    Block b = lease(2 * MiB);
    Block c = lease(2 * MiB);
    release(a);
    release(b);
    release(c);
    assertEquals(6 * MiB, stats().get(PoolMetric.CACHED_BYTES));

    assertEquals(4 * MiB, pool.setRetentionCap(2 * MiB));
    assertEquals(2 * MiB, stats().get(PoolMetric.RETENTION_CAP_BYTES));
    assertEquals(2 * MiB, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(Segment.State.FREED, b.segment.state);
    assertEquals(Segment.State.LIVE, c.segment.state);

    assertEquals(0, pool.setRetentionCap(32 * MiB), "raising evicts nothing");
    assertEquals(2 * MiB, pool.setRetentionCap(0));
    assertEquals(0, stats().get(PoolMetric.SEGMENTS));
    assertEquals(3, backend.frees());
  }

  @Test
  void setRetentionCap_isAppliedToLaterReleases() {
    pool.setRetentionCap(0);
    Block a = lease(4096);
    release(a);
    assertEquals(Segment.State.FREED, a.segment.state);
    pool.setRetentionCap(64 * MiB);
    Block b = lease(4096);
    release(b);
    assertEquals(Segment.State.LIVE, b.segment.state);
  }

  // ----------------------------------------------------------------------------------- trim

  @Test
  void trim_evictsLeastRecentlyIdleSegmentsDownToKeep() {
    Block a = lease(2 * MiB);
    Block b = lease(2 * MiB);
    Block c = lease(2 * MiB);
    Block partial = lease(4096);
    release(a);
    release(b);
    release(c);

    assertEquals(4 * MiB, pool.trim(3 * MiB));

    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(Segment.State.FREED, b.segment.state);
    assertEquals(Segment.State.LIVE, c.segment.state);
    assertEquals(2 * MiB, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(2 * MiB - 4096, stats().get(PoolMetric.REMAINDER_BYTES), "remainders of used segments are not trimmed");
    assertEquals(64 * MiB, stats().get(PoolMetric.RETENTION_CAP_BYTES), "a trim does not change the cap");

    assertEquals(2 * MiB, pool.trim(0));
    assertEquals(0, pool.trim(0));
    assertEquals(Segment.State.LIVE, partial.segment.state);
    assertEquals(1, stats().get(PoolMetric.SEGMENTS));
  }

  // ---------------------------------------------------------------------------------- budget

  @Test
  void lease_missPastBudget_evictsCachedSegmentsAndRetries() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(4 * MiB);
    lease(4 * MiB);
    release(a);

    Block small = lease(4096); // needs a new 2 MiB segment: 8 + 2 > 8, so a goes

    assertFalse(hit(small));
    assertEquals(Segment.State.FREED, a.segment.state);
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.ALLOC_RETRIES));
    assertEquals(0, s.get(PoolMetric.OOMS));
    assertEquals(1, s.get(PoolMetric.EVICTIONS));
    assertEquals(6 * MiB, s.get(PoolMetric.RESERVED_BYTES));
  }

  @Test
  void lease_missPastBudget_evictsOnlyWhatItNeeds() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block a = lease(2 * MiB);
    Block b = lease(2 * MiB);
    Block c = lease(2 * MiB);
    lease(2 * MiB);
    release(a);
    release(b);
    release(c);

    lease(4 * MiB - 512); // 8 MiB reserved; needs 4 MiB: two of the three cached segments go

    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(Segment.State.FREED, b.segment.state);
    assertEquals(Segment.State.LIVE, c.segment.state);
    assertEquals(1, stats().get(PoolMetric.ALLOC_RETRIES));
  }

  @Test
  void lease_pastBudgetWithNothingToEvict_isExhaustedAndStatesThePool() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    lease(4 * MiB);
    lease(4 * MiB);

    ExhaustedException e = assertThrows(ExhaustedException.class, () -> pool.lease(4096, false, "h", SegmentOwner.DAEMON));

    String message = e.getMessage();
    assertTrue(message.contains("requested=4096"), message);
    assertTrue(message.contains("leased=" + 8 * MiB), message);
    assertTrue(message.contains("cached=0"), message);
    assertTrue(message.contains("limit=" + 8 * MiB), message);
    assertTrue(message.contains("device 0"), message);
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.OOMS));
    assertEquals(0, s.get(PoolMetric.ALLOC_RETRIES));
    assertEquals(2, backend.allocs(), "no allocation was tried");
  }

  @Test
  void lease_pastBudget_messageAccountsForEveryReservedByte() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    lease(2 * MiB);
    Block waiting = lease(2 * MiB, false, "h1");
    checked.release(waiting, backend.newEvent()); // 2 MiB held until the client's event fires
    Block mapped = lease(2 * MiB, false, "h2");
    release(mapped);
    pool.trim(0); // 2 MiB held until h2 unmaps it
    lease(1 * MiB); // a small segment: 1 MiB leased, 1 MiB remainder

    ExhaustedException e = assertThrows(ExhaustedException.class, () -> pool.lease(4 * MiB, false, "h3", SegmentOwner.DAEMON));

    String message = e.getMessage();
    for (String figure : List.of("requested=" + 4 * MiB, "leased=" + 3 * MiB, "cached=0",
        "remainder=" + MiB, "awaiting_event=" + 2 * MiB, "awaiting_unmap=" + 2 * MiB, "in_flight=0",
        "limit=" + 8 * MiB)) {
      assertTrue(message.contains(figure), "'" + figure + "' missing from: " + message);
    }
    backend.events().get(0).complete();
    checked.pollEvents();
    pool.holderEnded("h2");
  }

  @Test
  void lease_pastBudget_whenEvictingCannotMakeRoom_evictsNothing() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    lease(4 * MiB);
    Block b = lease(2 * MiB);
    release(b); // 2 MiB cached, 6 MiB reserved

    ExhaustedException e = assertThrows(ExhaustedException.class, () -> pool.lease(6 * MiB, false, "h", SegmentOwner.DAEMON));

    assertTrue(e.getMessage().contains("cached=" + 2 * MiB), e.getMessage());
    assertEquals(Segment.State.LIVE, b.segment.state, "evicting b would not have made room");
    assertEquals(0, stats().get(PoolMetric.EVICTIONS));
    assertEquals(1, stats().get(PoolMetric.OOMS));
  }

  @Test
  void lease_largerThanTheBudget_isExhausted() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);

    assertThrows(ExhaustedException.class, () -> pool.lease(10 * MiB, false, "h", SegmentOwner.DAEMON));

    assertEquals(0, backend.allocs());
    assertEquals(1, stats().get(PoolMetric.OOMS));
  }

  @Test
  void lease_exactlyFillingTheBudget_succeeds() {
    use(64 * MiB, 8 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    lease(6 * MiB);
    lease(2 * MiB);
    assertEquals(8 * MiB, stats().get(PoolMetric.RESERVED_BYTES));
  }

  // ------------------------------------------------------------------------- backend memory

  @Test
  void lease_backendOutOfMemory_evictsAllIdleAndRetriesOnce() {
    use(8 * MiB, 64 * MiB, 64 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE); // the device is the limit
    Block a = lease(2 * MiB);
    Block b = lease(2 * MiB);
    lease(2 * MiB);
    release(a);
    release(b); // backend: 6 of 8 MiB used

    Block big = lease(4 * MiB); // 6 + 4 > 8: OOM, evict a and b, retry

    assertFalse(hit(big));
    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(Segment.State.FREED, b.segment.state);
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.ALLOC_RETRIES));
    assertEquals(2, s.get(PoolMetric.EVICTIONS));
    assertEquals(0, s.get(PoolMetric.OOMS));
  }

  @Test
  void lease_backendOutOfMemoryTwice_isExhausted() {
    Block a = lease(2 * MiB);
    release(a);
    backend.failNextAllocations(new BackendOutOfMemoryException("scripted: full")).staysFull("scripted: still full");

    ExhaustedException e = assertThrows(ExhaustedException.class, () -> pool.lease(4 * MiB, false, "h", SegmentOwner.DAEMON));
    backend.clearScriptedFailures();

    assertTrue(e.getMessage().contains("device memory exhausted"), e.getMessage());
    assertTrue(e.getMessage().contains("still full"), e.getMessage());
    assertEquals(Segment.State.FREED, a.segment.state, "everything idle was given back first");
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.ALLOC_RETRIES));
    assertEquals(1, s.get(PoolMetric.OOMS));
    assertEquals(0, s.get(PoolMetric.RESERVED_BYTES));
  }

  @Test
  void lease_backendOutOfMemoryWithNothingCached_isExhaustedWithoutRetry() {
    // "Without retry": no eviction-and-retry (nothing is cached); the device staying full past
    // the pool's short settle wait makes it certain.
    use(64 * MiB, 2 * MiB, 2 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE); // room for one segment
    backend.staysFull("scripted: device full");

    assertThrows(ExhaustedException.class, () -> pool.lease(4096, false, "h", SegmentOwner.DAEMON));
    backend.clearScriptedFailures();

    assertEquals(0, stats().get(PoolMetric.ALLOC_RETRIES));
    assertEquals(1, stats().get(PoolMetric.OOMS));
    // The failed allocation's bytes are no longer counted in flight: the budget admits a segment.
    assertFalse(hit(lease(4096)));
  }

  @Test
  void lease_backendFailure_propagatesAndLeavesThePoolConsistent() {
    use(64 * MiB, 2 * MiB, 2 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE); // room for one segment
    BackendException failure = new BackendException("scripted: driver error");
    backend.failNextAllocations(failure);

    BackendException thrown = assertThrows(BackendException.class, () -> pool.lease(4096, false, "h", SegmentOwner.DAEMON));

    assertSame(failure, thrown);
    PoolStats s = stats();
    assertEquals(0, s.get(PoolMetric.MISSES));
    assertEquals(0, s.get(PoolMetric.OOMS), "not a lack of memory");
    assertEquals(0, s.get(PoolMetric.RESERVED_BYTES));
    // The failed allocation's bytes are no longer counted in flight: the budget admits a segment.
    Block b = lease(4096);
    assertFalse(hit(b));
  }
}
