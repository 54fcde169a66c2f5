package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.SegmentOwner;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;

/**
 * The isolation rule: blocks of different owners never share a segment, and a segment never
 * changes owner; memory passes between owners only through a backend free and allocation, and
 * is zeroed on the way when the backend does not zero fresh memory.
 */
class DevicePoolOwnerTest extends PoolTestBase {
  private static final SegmentOwner A = new SegmentOwner("uid:1000", 1000, 1000);
  private static final SegmentOwner B = new SegmentOwner("uid:1001", 1001, -1);
  private static final SegmentOwner C = SegmentOwner.of("session-c");

  /** The owner the backend was asked to allocate the block's segment for. */
  private static SegmentOwner backendOwner(Block block) {
    return ((InMemoryBackend.FakeSegment) block.memory()).owner();
  }

  @Test
  void interleavedSmallLeasesOfThreeOwners_neverShareASegment() {
    List<SegmentOwner> owners = List.of(A, B, C);
    Map<Long, SegmentOwner> ownerOfSegment = new HashMap<>();
    Map<SegmentOwner, List<Block>> held = new HashMap<>();
    Random random = new Random(13);
    for (int i = 0; i < 600; i++) {
      SegmentOwner owner = owners.get(i % owners.size());
      List<Block> mine = held.computeIfAbsent(owner, o -> new ArrayList<>());
      if (!mine.isEmpty() && random.nextInt(3) == 0) {
        // Releases leave free remainders and coalesced blocks in shared-looking places: the
        // next leases of the other owners must still not land there.
        release(mine.remove(random.nextInt(mine.size())));
      } else {
        Block block = checked.lease(512L * (1 + random.nextInt(64)), false, "holder-" + owner.key(), owner);
        mine.add(block);
        SegmentOwner previous = ownerOfSegment.putIfAbsent(block.segmentId(), owner);
        if (previous != null) {
          assertEquals(previous, owner, "segment " + block.segmentId() + " of " + previous + " carved a block for " + owner);
        }
        assertEquals(owner.key(), block.segment.owner);
        assertEquals(owner, backendOwner(block), "the backend allocated the segment for its owner");
      }
      if (i % 50 == 0) {
        checked.verify();
      }
    }
    Set<SegmentOwner> owning = new HashSet<>(ownerOfSegment.values());
    assertEquals(Set.copyOf(owners), owning, "every owner got segments of its own");
    assertTrue(ownerOfSegment.size() >= 3, "one segment per owner at least: " + ownerOfSegment.size());
    checked.verify();
    held.values().forEach(blocks -> blocks.forEach(this::release));
  }

  @Test
  void releasedBlock_isAHitForItsOwner_andAMissForAnother() {
    Block first = checked.lease(4096, false, "a1", A);
    release(first);
    checked.verify();

    // B cannot have A's cached block, not even through the cache-only path.
    assertNull(checked.tryLeaseCached(4096, "b1", B));
    Block ofB = checked.lease(4096, false, "b1", B);
    assertFalse(hit(ofB), "another owner's cached block is never a hit");
    assertNotEquals(first.segmentId(), ofB.segmentId());
    assertEquals(2, backend.allocs());
    checked.verify();

    // A gets its own block back, as before owners existed.
    Block again = checked.tryLeaseCached(4096, "a2", A);
    assertTrue(again != null && hit(again), "the owner's own cached block is a hit");
    assertEquals(first.segmentId(), again.segmentId());
    assertEquals(2, stats().get(PoolMetric.MISSES));
    assertEquals(1, stats().get(PoolMetric.HITS));
    checked.verify();
    release(again);
    release(ofB);
  }

  @Test
  void freeRemainderOfAnOwnersSegment_isNotUsedForAnother() {
    Block ofA = checked.lease(4096, false, "a", A); // 2 MiB segment, ~2 MiB remainder left free

    Block ofB = checked.lease(4096, false, "b", B);

    assertFalse(hit(ofB));
    assertNotEquals(ofA.segmentId(), ofB.segmentId());
    assertEquals(4 * MiB - 2 * 4096, stats().get(PoolMetric.REMAINDER_BYTES));
    checked.verify();
    release(ofA);
    release(ofB);
  }

  @Test
  void budgetFullOfAnotherOwnersIdleSegments_isEvictedThroughTheUnmapHandshake() {
    use(new CheckedPool(new InMemoryBackend(1, 8 * MiB, true), new PoolSettings(8 * MiB, 8 * MiB, 20 * MiB, 5_000)));
    List<CompletableFuture<Void>> unmaps = new java.util.concurrent.CopyOnWriteArrayList<>();
    checked.onUnmapRequest((holder, device, segmentId) ->
        unmaps.add(CompletableFuture.runAsync(() -> pool.unmapped(holder, segmentId))));
    Block a1 = checked.lease(4 * MiB, false, "a", A);
    Block a2 = checked.lease(4 * MiB, false, "a", A);
    release(a1);
    release(a2);
    assertEquals(8 * MiB, stats().get(PoolMetric.CACHED_BYTES), "the budget is all A's idle memory");
    checked.verify();

    Block ofB = checked.lease(4 * MiB, false, "b", B);

    assertFalse(hit(ofB));
    assertEquals(B, backendOwner(ofB));
    assertNotEquals(a1.segmentId(), ofB.segmentId());
    assertNotEquals(a2.segmentId(), ofB.segmentId());
    assertTrue(stats().get(PoolMetric.EVICTIONS) >= 1, "A's idle memory made room");
    assertEquals(new CheckedPool.UnmapRequest("a", 0, a1.segmentId()), checked.unmapRequests().get(0),
        "A's holder was asked to unmap the least recently used segment before its free");
    // The lease went ahead once one unmap was confirmed; let the others land too.
    unmaps.forEach(CompletableFuture::join);
    assertEquals(stats().get(PoolMetric.EVICTIONS), checked.unmapRequests().size());
    assertFalse(backend.isLive(a1.memory()), "A's evicted segment went back to the backend, not to B");
    checked.verify();
    release(ofB);
    pool.holderEnded("a");
  }

  @Test
  void nonZeroingBackend_newOwnerReadsZeros_andScrubbedBytesCountsTheSegment() {
    backend.freshSegmentsZeroed(false); // CUDA: fresh memory may hold another owner's bytes
    Block ofA = checked.lease(4096, false, "a", A);
    assertTrue(InMemoryBackend.isZero(ofA.memory(), 0, 2 * MiB), "the whole new segment was zeroed");
    InMemoryBackend.fill(ofA.memory(), ofA.offset(), ofA.size(), (byte) 0x5a);
    release(ofA);

    Block ofB = checked.lease(4096, false, "b", B);

    assertFalse(hit(ofB));
    assertTrue(InMemoryBackend.isZero(ofB.memory(), ofB.offset(), ofB.size()), "B reads zeros, not garbage");
    assertEquals(4 * MiB, stats().get(PoolMetric.SCRUBBED_BYTES), "two 2 MiB segments came to an owner");
    assertEquals(List.of(
        new InMemoryBackend.ZeroCall((InMemoryBackend.FakeSegment) ofA.memory(), 0, 2 * MiB),
        new InMemoryBackend.ZeroCall((InMemoryBackend.FakeSegment) ofB.memory(), 0, 2 * MiB)), backend.zeroCalls());
    checked.verify();

    // Within one owner nothing changes: a hit is not scrubbed, the owner's bytes are still there.
    Block againA = checked.lease(4096, false, "a", A);
    assertTrue(hit(againA));
    assertFalse(InMemoryBackend.isZero(againA.memory(), againA.offset(), againA.size()));
    assertEquals(4 * MiB, stats().get(PoolMetric.SCRUBBED_BYTES));
    assertEquals(2, backend.zeroes());
    release(againA);
    release(ofB);
  }

  @Test
  void nonZeroingBackend_zeroedLeaseOfANewSegment_isZeroedOnce() {
    backend.freshSegmentsZeroed(false);

    Block fresh = checked.lease(4096, true, "a", A);

    assertEquals(List.of(new InMemoryBackend.ZeroCall((InMemoryBackend.FakeSegment) fresh.memory(), 0, 2 * MiB)),
        backend.zeroCalls(), "the scrub covers the block: no second zeroing");
    assertTrue(InMemoryBackend.isZero(fresh.memory(), fresh.offset(), fresh.size()));
    release(fresh);
  }

  @Test
  void zeroingBackend_scrubsNothing() {
    Block ofA = checked.lease(4096, false, "a", A);
    Block ofB = checked.lease(4096, false, "b", B);

    assertEquals(0, stats().get(PoolMetric.SCRUBBED_BYTES), "host: new segments already read as zeros");
    assertEquals(0, backend.zeroes());
    release(ofA);
    release(ofB);
  }

  @Test
  void scrubFailure_givesTheSegmentBackAndRethrows() {
    backend.freshSegmentsZeroed(false);
    BackendException failure = new BackendException("scripted: memset failed");
    backend.failNextZero(failure);

    BackendException thrown = assertThrows(BackendException.class, () -> pool.lease(4096, false, "a", A));

    assertSame(failure, thrown);
    assertEquals(0, backend.liveSegments(), "the unscrubbed segment went back to the backend");
    assertEquals(0, stats().get(PoolMetric.RESERVED_BYTES));
    assertEquals(0, stats().get(PoolMetric.SCRUBBED_BYTES));
    checked.verify();
    Block next = checked.lease(4096, false, "a", A);
    assertTrue(InMemoryBackend.isZero(next.memory(), next.offset(), next.size()));
    release(next);
  }

  @Test
  void ownersThatCome_andGo_leaveNoFreeIndexBehind() {
    for (int i = 0; i < 20; i++) {
      release(checked.lease(4096, false, "h" + i, SegmentOwner.of("session-" + i)));
      pool.holderEnded("h" + i);
    }
    assertEquals(20, pool.core.carver.free.byOwner().size(), "each owner's idle segment is cached under its owner");

    pool.trim(0);

    assertEquals(0, pool.core.carver.free.byOwner().size(), "evicting an owner's last free block drops its index");
    checked.verify();
  }

  @Test
  void ownersWholeFreeMemoryLeased_dropsItsIndex() {
    Block whole = checked.lease(2 * MiB, false, "a", A);
    release(whole);
    assertEquals(Set.of(A.key()), pool.core.carver.free.byOwner().keySet());

    Block again = checked.lease(2 * MiB, false, "a", A);

    assertTrue(hit(again));
    assertTrue(pool.core.carver.free.byOwner().isEmpty(), "no empty index kept for A: " + pool.core.carver.free.byOwner());
    checked.verify();
    release(again);
  }
}
