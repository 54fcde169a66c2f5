package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.pool.InMemoryBackend.FakeEvent;
import org.junit.jupiter.api.Test;

/**
 * Rule 3: a release that carries a completion event makes its block reusable only once the
 * event has completed, as {@link DevicePool#pollEvents()} finds out; an event that cannot be
 * queried never makes it reusable.
 */
class DevicePoolEventTest extends PoolTestBase {

  @Test
  void release_withEvent_blockIsNotReusedUntilTheEventCompletes() {
    Block a = lease(4096, false, "h1");
    lease(4096, false, "h1"); // keeps the segment in use
    FakeEvent event = backend.newEvent();

    checked.release(a, event);

    PoolStats s = stats();
    assertEquals(4096, s.get(PoolMetric.AWAITING_EVENT_BYTES));
    assertEquals(1, s.get(PoolMetric.BLOCKS_AWAITING_EVENT));
    assertEquals(4096, s.get(PoolMetric.LEASED_BYTES), "only the other block is leased");
    assertEquals(1, s.get(PoolMetric.ACTIVE_LEASES));
    assertEquals(0, s.get(PoolMetric.RETURNS));
    assertTrue((pool.stats().get(PoolMetric.BLOCKS_AWAITING_EVENT) > 0));

    Block meanwhile = lease(4096, false, "h2");
    assertNotEquals(a.offset(), meanwhile.offset(), "the block waiting for its event is not handed out");
    checked.pollEvents();
    assertTrue(event.queries() > 0);
    assertTrue((pool.stats().get(PoolMetric.BLOCKS_AWAITING_EVENT) > 0), "still running");
    assertFalse(event.closed());

    event.complete();
    checked.pollEvents();

    assertFalse((pool.stats().get(PoolMetric.BLOCKS_AWAITING_EVENT) > 0));
    assertTrue(event.closed(), "the pool closes the event once done with it");
    assertEquals(1, stats().get(PoolMetric.RETURNS));
    assertEquals(0, stats().get(PoolMetric.AWAITING_EVENT_BYTES));
    Block reused = lease(4096, false, "h2");
    assertTrue(hit(reused));
    assertEquals(a.offset(), reused.offset());
  }

  @Test
  void release_withEvent_keepsTheSegmentFromBeingCachedOrEvicted() {
    Block a = lease(4 * MiB, false, "h1");
    FakeEvent event = backend.newEvent();
    checked.release(a, event);

    assertEquals(0, stats().get(PoolMetric.CACHED_BYTES), "a segment with a block in flight is not idle");
    assertEquals(0, pool.trim(0));
    assertEquals(0, pool.setRetentionCap(0));
    assertNull(checked.tryLeaseCached(4 * MiB, "h2"));
    assertTrue(backend.isLive(a.memory()));

    event.complete();
    checked.pollEvents(); // cap is 0 now: the segment is evicted as soon as it is idle

    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state, "h1 may still map it");
    pool.holderEnded("h1");
    assertEquals(Segment.State.FREED, a.segment.state);
  }

  @Test
  void pollEvents_completesOnlyTheEventsThatAreDone() {
    Block a = lease(4096, false, "h1");
    Block b = lease(4096, false, "h1");
    lease(4096, false, "h1");
    FakeEvent first = backend.newEvent();
    FakeEvent second = backend.newEvent();
    checked.release(a, first);
    checked.release(b, second);

    second.complete();
    checked.pollEvents();

    assertEquals(Block.State.AWAITING_EVENT, a.state);
    assertEquals(Block.State.FREE, b.state);
    assertEquals(4096, stats().get(PoolMetric.AWAITING_EVENT_BYTES));
    assertTrue(second.closed());
    assertFalse(first.closed());

    first.complete();
    checked.pollEvents();
    assertEquals(0, stats().get(PoolMetric.AWAITING_EVENT_BYTES));
    assertEquals(8192, a.size, "a and b coalesced once both were back");
  }

  @Test
  void pollEvents_whenTheEventQueryFails_neverReusesTheBlock() {
    Block a = lease(4096, false, "h1");
    Block other = lease(4096, false, "h1");
    FakeEvent event = backend.newEvent();
    event.failQueriesWith(new BackendException("scripted: cuEventQuery failed: CUDA_ERROR_LAUNCH_FAILED"));
    checked.release(a, event);

    checked.pollEvents();

    assertEquals(Block.State.AWAITING_EVENT, a.state, "an error is not a completion");
    assertTrue(event.closed(), "the pool is done with an event it cannot query");
    assertEquals(1, pool.core.events.strandedCount());
    assertEquals(4096, stats().get(PoolMetric.AWAITING_EVENT_BYTES), "its bytes stay counted");
    assertEquals(1, stats().get(PoolMetric.BLOCKS_AWAITING_EVENT));
    assertEquals(0, stats().get(PoolMetric.RETURNS));
    long queries = event.queries();

    checked.pollEvents();
    assertEquals(queries, event.queries(), "a stranded block's event is never queried again");
    Block next = lease(4096, false, "h1");
    assertNotEquals(a.offset(), next.offset(), "the stranded block is not handed out");
    release(next);
    release(other);
    assertEquals(0, stats().get(PoolMetric.CACHED_BYTES), "its segment is never idle, so never cached");
    assertEquals(0, pool.trim(0), "nor evicted");
    assertTrue(backend.isLive(a.memory()));
  }

  @Test
  void pollEvents_aFailedQueryStrandsOnlyItsOwnBlock() {
    Block a = lease(4096, false, "h1");
    Block b = lease(4096, false, "h1");
    lease(4096, false, "h1");
    FakeEvent failing = backend.newEvent();
    failing.failQueriesWith(new BackendException("scripted: context gone"));
    FakeEvent done = backend.newEvent();
    done.complete();
    checked.release(a, failing);
    checked.release(b, done);

    checked.pollEvents();

    assertEquals(Block.State.AWAITING_EVENT, a.state);
    assertEquals(Block.State.FREE, b.state);
    assertEquals(1, stats().get(PoolMetric.RETURNS));
    assertEquals(4096, stats().get(PoolMetric.AWAITING_EVENT_BYTES));
  }

  @Test
  void pollEvents_withNothingWaiting_doesNothing() {
    checked.pollEvents();
    assertFalse((pool.stats().get(PoolMetric.BLOCKS_AWAITING_EVENT) > 0));
    assertEquals(0, backend.allocs());
  }
}
