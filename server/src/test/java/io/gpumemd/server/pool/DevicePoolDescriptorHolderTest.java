package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.CheckedPool.UnmapRequest;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.Test;

/**
 * A process that was sent a segment's descriptor holds the segment beside the sessions
 * ({@link DescriptorHolder}): an evicted segment waits for it without asking it, counts against
 * its tenant, and is freed once it ends, is dropped, or its session confirms the unmap.
 */
class DevicePoolDescriptorHolderTest extends PoolTestBase {
  private static final DescriptorHolder PROCESS = new DescriptorHolder(4242, 77, "s1", "uid:1000");

  @Test
  void key_roundTrips_withATenantThatHoldsColons() {
    DescriptorHolder holder = new DescriptorHolder(1, 2, "abc", "cert:CN=a:b");
    assertEquals(holder, DescriptorHolder.parse(holder.key()));
    assertTrue(DescriptorHolder.isKey(holder.key()));
    assertFalse(DescriptorHolder.isKey("0123456789abcdef0123456789abcdef"));
    assertThrows(IllegalArgumentException.class, () -> DescriptorHolder.parse("fd:x:1:s:t"));
    assertThrows(IllegalArgumentException.class, () -> DescriptorHolder.parse("fd:1:2:s"));
  }

  @Test
  void aProcessKeepsAnEvictedSegment_afterItsSessionEnded_andItsTenantIsCharged() {
    Block a = lease(4096, false, "s1");
    pool.descriptorSent(a.segmentId(), PROCESS);
    release(a);
    pool.holderEnded("s1"); // the session ends; its process may still map the segment

    assertEquals(2 * MiB, pool.trim(0));

    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state);
    assertTrue(backend.isLive(a.memory()), "not freed while the process may map it");
    assertEquals(List.of(), checked.unmapRequests(), "a process is never asked: it has no channel to answer on");
    assertEquals(2 * MiB, pool.pinnedBytes("uid:1000"));
    assertEquals(0, pool.pinnedBytes("uid:2000"));
    assertEquals(2 * MiB, stats().get(PoolMetric.RESERVED_BYTES), "the budget still counts it");
    assertEquals(List.of(PROCESS.key()), pool.descriptorHolders());

    pool.holderEnded(PROCESS.key()); // the process exited

    assertEquals(Segment.State.FREED, a.segment.state);
    assertFalse(backend.isLive(a.memory()));
    assertEquals(0, pool.pinnedBytes("uid:1000"));
    assertEquals(List.of(), pool.descriptorHolders());
  }

  @Test
  void theSessionsUnmapSpeaksForTheProcessesThatFetchedForIt() {
    Block a = lease(4096, false, "s1");
    Block b = lease(4096, false, "s2");
    pool.descriptorSent(a.segmentId(), PROCESS);
    DescriptorHolder other = new DescriptorHolder(5151, 9, "s2", "uid:1000");
    pool.descriptorSent(a.segmentId(), other);
    release(a);
    release(b);
    pool.trim(0);
    assertEquals(Set.of(new UnmapRequest("s1", 0, a.segmentId()), new UnmapRequest("s2", 0, a.segmentId())),
        Set.copyOf(checked.unmapRequests()));

    pool.unmapped("s1", a.segmentId());
    assertEquals(Segment.State.AWAITING_UNMAP, a.segment.state, "s2 and its process may still map it");
    assertEquals(List.of(other.key()), pool.descriptorHolders());

    pool.unmapped("s2", a.segmentId());

    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(List.of(), pool.descriptorHolders());
  }

  @Test
  void droppingAProcessFromOneSegment_freesThatSegmentOnly() {
    Block a = lease(3 * MiB, false, "s1");
    Block b = lease(3 * MiB, false, "s1");
    assertFalse(a.segmentId() == b.segmentId());
    pool.descriptorSent(a.segmentId(), PROCESS);
    pool.descriptorSent(b.segmentId(), PROCESS);
    release(a);
    release(b);
    pool.holderEnded("s1");
    pool.trim(0);
    assertEquals(Set.of(a.segmentId(), b.segmentId()), pool.segmentsOf(PROCESS.key()).keySet());

    pool.dropped(PROCESS.key(), a.segmentId()); // the kernel shows it no longer maps a

    assertEquals(Segment.State.FREED, a.segment.state);
    assertEquals(Segment.State.AWAITING_UNMAP, b.segment.state);
    assertEquals(b.segment.bytes, pool.pinnedBytes("uid:1000"));
  }

  @Test
  void aProcessOfALiveSegment_isChargedOnlyOnceTheSegmentIsEvicted() {
    Block a = lease(4096, false, "s1");
    pool.descriptorSent(a.segmentId(), PROCESS);
    release(a);
    pool.holderEnded("s1");

    assertEquals(0, pool.pinnedBytes("uid:1000"), "cached: reusable by the tenant, counted as cache");
    Block again = lease(4096, false, "s3");
    assertEquals(a.segmentId(), again.segmentId());
    release(again);
    pool.holderEnded("s3");
    pool.holderEnded(PROCESS.key());
  }
}
