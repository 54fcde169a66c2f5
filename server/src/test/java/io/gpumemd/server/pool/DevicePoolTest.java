package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.SegmentOwner;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The pool's size classes, best fit, splitting, coalescing, zeroing and the cached-only fast
 * path, against an {@link InMemoryBackend}; every test ends with {@link CheckedPool#verify()}.
 */
class DevicePoolTest extends PoolTestBase {

  // ------------------------------------------------------------------------------ sizes

  @Test
  void lease_roundsRequestsUpTo512Bytes() {
    Block one = lease(1);
    Block exact = lease(512);
    Block over = lease(513);

    assertEquals(512, one.size());
    assertEquals(512, exact.size());
    assertEquals(1024, over.size());
    // Carved one after the other from the same segment.
    assertEquals(0, one.offset());
    assertEquals(512, exact.offset());
    assertEquals(1024, over.offset());
    assertEquals(2048, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(3, stats().get(PoolMetric.ACTIVE_LEASES));
  }

  @Test
  void lease_small_isCarvedFromATwoMiBSegmentAndTheRestStaysFree() {
    Block first = lease(1000);

    assertFalse(hit(first));
    assertEquals(2 * MiB, first.segmentBytes());
    assertEquals(0, first.offset());
    assertEquals(1024, first.size());
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.MISSES));
    assertEquals(1, s.get(PoolMetric.SEGMENTS));
    assertEquals(2 * MiB, s.get(PoolMetric.RESERVED_BYTES));
    assertEquals(2 * MiB - 1024, s.get(PoolMetric.REMAINDER_BYTES));
    assertEquals(0, s.get(PoolMetric.CACHED_BYTES), "a segment with a lease is not cached");
    assertEquals(1, s.get(PoolMetric.CACHED_BLOCKS));

    Block second = lease(300 * KiB);
    assertTrue(hit(second), "served from the remainder of the first segment");
    assertEquals(first.segmentId(), second.segmentId());
    assertEquals(1024, second.offset());

    Block third = lease(1 * MiB); // the largest small request still fits the remainder
    assertTrue(hit(third));
    assertEquals(first.segmentId(), third.segmentId());
    assertEquals(1024 + 300 * KiB, third.offset());

    Block fourth = lease(1 * MiB); // 2 MiB - 1 KiB - 300 KiB - 1 MiB left: a new segment
    assertFalse(hit(fourth));
    assertNotEquals(first.segmentId(), fourth.segmentId());
    assertEquals(2, stats().get(PoolMetric.SEGMENTS));
    assertEquals(2, backend.allocs());
  }

  @Test
  void lease_afterRelease_isPoolHit() {
    Block first = lease(4096);
    release(first);
    Block again = lease(4096);

    assertTrue(hit(again));
    assertEquals(first.segmentId(), again.segmentId());
    assertEquals(first.offset(), again.offset());
    PoolStats s = stats();
    assertEquals(1, s.get(PoolMetric.HITS));
    assertEquals(1, s.get(PoolMetric.MISSES));
    assertEquals(1, s.get(PoolMetric.RETURNS));
    assertEquals(1, backend.allocs());
  }

  @Test
  void release_coalescesWithBothNeighbours() {
    Block keep = lease(4 * KiB);
    Block a = lease(8 * KiB);
    Block b = lease(16 * KiB);
    Block c = lease(32 * KiB);
    assertEquals(1, stats().get(PoolMetric.CACHED_BLOCKS), "one free block: the tail of the segment");

    release(a); // between two leased blocks: stays alone
    assertEquals(2, stats().get(PoolMetric.CACHED_BLOCKS));
    release(c); // merges with the free tail
    assertEquals(2, stats().get(PoolMetric.CACHED_BLOCKS));
    release(b); // merges with a before and c + tail after
    assertEquals(1, stats().get(PoolMetric.CACHED_BLOCKS));

    Block free = keep.next;
    assertEquals(Block.State.FREE, free.state);
    assertEquals(4 * KiB, free.offset);
    assertEquals(2 * MiB - 4 * KiB, free.size);
    assertNull(free.next);
    assertEquals(2 * MiB - 4 * KiB, stats().get(PoolMetric.REMAINDER_BYTES));

    release(keep); // and the whole segment is one cached block again
    assertEquals(1, stats().get(PoolMetric.CACHED_BLOCKS));
    assertEquals(2 * MiB, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(0, stats().get(PoolMetric.REMAINDER_BYTES));
    assertEquals(2 * MiB, keep.segment.head.size);
  }

  @Test
  void release_coalescesWithPreviousOnly_whenNextIsLeased() {
    Block a = lease(8 * KiB);
    Block b = lease(8 * KiB);
    Block wall = lease(8 * KiB);

    release(a);
    release(b);

    Block merged = wall.segment.head;
    assertEquals(Block.State.FREE, merged.state);
    assertEquals(16 * KiB, merged.size);
    assertSame(wall, merged.next);
    assertEquals(2, stats().get(PoolMetric.CACHED_BLOCKS), "the merged block and the tail");
    // The merged range serves a request of its full size.
    Block big = lease(16 * KiB);
    assertTrue(hit(big));
    assertEquals(0, big.offset());
  }

  @Test
  void lease_large_getsASegmentRoundedToTwoMiB() {
    Block justOverSmall = lease(1 * MiB + 1);
    Block three = lease(3 * MiB);
    Block fiveAndABit = lease(5 * MiB + 100);
    Block ten = lease(10 * MiB);

    assertEquals(2 * MiB, justOverSmall.segmentBytes());
    assertEquals(4 * MiB, three.segmentBytes());
    assertEquals(6 * MiB, fiveAndABit.segmentBytes());
    assertEquals(10 * MiB, ten.segmentBytes());
    // No remainder over 1 MiB: each block takes its whole segment.
    assertEquals(2 * MiB, justOverSmall.size());
    assertEquals(4 * MiB, three.size());
    assertEquals(6 * MiB, fiveAndABit.size());
    assertEquals(10 * MiB, ten.size());
    assertEquals(4, stats().get(PoolMetric.MISSES));
    assertEquals(22 * MiB, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(0, stats().get(PoolMetric.REMAINDER_BYTES));
  }

  @Test
  void lease_large_splitsOnlyWhenMoreThanOneMiBRemains() {
    // Fresh segment: 2.5 MiB rounds to a 4 MiB segment, 1.5 MiB remains: split.
    Block first = lease(2 * MiB + 512 * KiB);
    assertEquals(4 * MiB, first.segmentBytes());
    assertEquals(2 * MiB + 512 * KiB, first.size());
    assertEquals(MiB + 512 * KiB, stats().get(PoolMetric.REMAINDER_BYTES));
    Block rest = lease(MiB + 512 * KiB);
    assertTrue(hit(rest), "the split-off remainder is in the large index");
    assertEquals(first.segmentId(), rest.segmentId());
    assertEquals(2 * MiB + 512 * KiB, rest.offset());

    // Cached segment: exactly 1 MiB would remain: not split.
    Block eight = lease(8 * MiB);
    release(eight);
    Block seven = lease(7 * MiB);
    assertTrue(hit(seven));
    assertEquals(8 * MiB, seven.size());
    release(seven);
    // 1 MiB + 512 B would remain: split.
    Block sevenLess = lease(7 * MiB - 512);
    assertTrue(hit(sevenLess));
    assertEquals(7 * MiB - 512, sevenLess.size());
    assertEquals(MiB + 512, sevenLess.next.size);
    assertEquals(Block.State.FREE, sevenLess.next.state);
  }

  @Test
  void lease_small_splitsWheneverAtLeast512BytesRemain() {
    Block whole = lease(1 * MiB);
    release(whole);
    // The cached segment is 2 MiB; a 1 MiB - 512 request leaves 1 MiB + 512 B: split.
    Block b = lease(1 * MiB - 512);
    assertEquals(1 * MiB - 512, b.size());
    assertEquals(Block.State.FREE, b.next.state);
    assertEquals(1 * MiB + 512, b.next.size);
  }

  // ------------------------------------------------------------------------------ best fit

  @Test
  void lease_bestFit_picksTheSmallestFittingSmallBlock() {
    Block eight = lease(8 * KiB);
    lease(512);
    Block four = lease(4 * KiB);
    lease(512);
    Block sixteen = lease(16 * KiB);
    lease(512);
    release(eight);
    release(four);
    release(sixteen);

    Block forThree = lease(3 * KiB);
    assertEquals(four.offset(), forThree.offset(), "3 KiB goes into the 4 KiB hole");
    Block forFive = lease(5 * KiB);
    assertEquals(eight.offset(), forFive.offset(), "5 KiB goes into the 8 KiB hole");
    Block forTwelve = lease(12 * KiB);
    assertEquals(sixteen.offset(), forTwelve.offset(), "12 KiB goes into the 16 KiB hole");
    Block forOne = lease(1 * KiB);
    assertEquals(four.offset() + 3 * KiB, forOne.offset(), "1 KiB goes into what the 3 KiB left");
    assertEquals(1, backend.allocs());
  }

  @Test
  void lease_bestFit_picksTheSmallestFittingLargeSegment() {
    Block four = lease(4 * MiB);
    Block eight = lease(8 * MiB);
    Block six = lease(6 * MiB);
    release(four);
    release(eight);
    release(six);

    assertEquals(six.segmentId(), lease(5 * MiB).segmentId());
    assertEquals(eight.segmentId(), lease(7 * MiB).segmentId());
    assertEquals(four.segmentId(), lease(3 * MiB).segmentId());
    assertEquals(3, backend.allocs());
    assertEquals(3, stats().get(PoolMetric.HITS));
  }

  @Test
  void lease_cachedBlockMoreThanMaxOversizeLarger_isNotUsed() {
    use(128 * MiB, 128 * MiB, 128 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Block big = lease(32 * MiB);
    release(big);

    Block ten = lease(10 * MiB); // 32 > 10 + 20: a new segment, the big one stays cached
    assertFalse(hit(ten));
    assertNotEquals(big.segmentId(), ten.segmentId());
    assertEquals(32 * MiB, stats().get(PoolMetric.CACHED_BYTES));

    Block twelve = lease(12 * MiB); // 32 == 12 + 20: still allowed, and split
    assertTrue(hit(twelve));
    assertEquals(big.segmentId(), twelve.segmentId());
    assertEquals(12 * MiB, twelve.size());
    assertEquals(20 * MiB, stats().get(PoolMetric.REMAINDER_BYTES));
  }

  @Test
  void lease_withMaxOversizeZero_usesOnlyExactLargeFits() {
    use(64 * MiB, 64 * MiB, 64 * MiB, 0);
    Block four = lease(4 * MiB);
    release(four);

    Block three = lease(3 * MiB);
    assertFalse(hit(three), "4 MiB > 3 MiB + 0");
    Block exact = lease(4 * MiB);
    assertTrue(hit(exact));
    assertEquals(four.segmentId(), exact.segmentId());
  }

  @Test
  void lease_withCustomMaxOversize_allowsBlocksWithinIt() {
    use(64 * MiB, 64 * MiB, 64 * MiB, 1 * MiB);
    Block four = lease(4 * MiB);
    release(four);

    Block three = lease(3 * MiB);
    assertTrue(hit(three), "4 MiB <= 3 MiB + 1 MiB");
    assertEquals(4 * MiB, three.size(), "1 MiB remainder is not split off");
    release(three);
    Block two = lease(2 * MiB);
    assertFalse(hit(two), "4 MiB > 2 MiB + 1 MiB");
    assertEquals(4 * MiB, stats().get(PoolMetric.CACHED_BYTES));
  }

  @Test
  void lease_small_ignoresMaxOversize() {
    use(64 * MiB, 64 * MiB, 64 * MiB, 0);
    release(lease(1 * MiB)); // leaves a whole, cached 2 MiB small segment

    Block tiny = lease(512);
    assertTrue(hit(tiny), "small requests are carved from 2 MiB segments whatever the oversize rule");
  }

  // ------------------------------------------------------------------------ cached-only path

  @Test
  void tryLeaseCached_onMiss_returnsNullWithoutAllocating() {
    assertNull(checked.tryLeaseCached(4096, "h"));
    assertEquals(0, backend.allocs());
    assertEquals(0, stats().get(PoolMetric.HITS) + stats().get(PoolMetric.MISSES));

    release(lease(4096));
    Block hit = checked.tryLeaseCached(4096, "h");
    assertNotNull(hit);
    assertEquals(1, backend.allocs());
    assertEquals(1, stats().get(PoolMetric.HITS));
    release(hit);
    // A cached block past the oversize rule is not a fit here either.
    release(lease(32 * MiB));
    assertNull(checked.tryLeaseCached(4 * MiB, "h"));
    assertEquals(2, backend.allocs());
    assertEquals(2 * MiB + 32 * MiB, stats().get(PoolMetric.CACHED_BYTES), "the small segment and the big one");
  }

  // ------------------------------------------------------------------------------- zeroing

  @Test
  void lease_zeroOnHit_zeroesTheBlockAndOnlyIt() {
    Block dirty = lease(4096);
    Block neighbour = lease(4096);
    InMemoryBackend.fill(dirty.memory(), dirty.offset(), dirty.size(), (byte) 0x5a);
    InMemoryBackend.fill(neighbour.memory(), neighbour.offset(), neighbour.size(), (byte) 0x33);
    release(dirty);

    Block clean = lease(4096, true, "h");

    assertTrue(hit(clean));
    assertEquals(dirty.offset(), clean.offset());
    assertEquals(List.of(new InMemoryBackend.ZeroCall(
        (InMemoryBackend.FakeSegment) clean.memory(), clean.offset(), 4096)), backend.zeroCalls());
    assertTrue(InMemoryBackend.isZero(clean.memory(), clean.offset(), clean.size()));
    assertFalse(InMemoryBackend.isZero(neighbour.memory(), neighbour.offset(), neighbour.size()),
        "zeroing stays inside the block");
  }

  @Test
  void lease_zeroFalse_neverZeroes() {
    Block dirty = lease(4096);
    InMemoryBackend.fill(dirty.memory(), dirty.offset(), dirty.size(), (byte) 0x5a);
    release(dirty);

    Block reused = lease(4096, false, "h");

    assertTrue(hit(reused));
    assertEquals(0, backend.zeroes());
    assertFalse(InMemoryBackend.isZero(reused.memory(), reused.offset(), reused.size()));
  }

  @Test
  void lease_zeroOnFreshSegment_skipsZeroingWhenFreshMemoryReadsAsZeros() {
    Block fresh = lease(4096, true, "h");

    assertFalse(hit(fresh));
    assertTrue(backend.freshSegmentsAreZeroed());
    assertEquals(0, backend.zeroes(), "a new host segment is already zero");
  }

  @Test
  void lease_zeroOnFreshSegment_whenFreshMemoryIsNotZeroed_zeroesTheSegmentOnly() {
    backend.freshSegmentsZeroed(false); // CUDA semantics: cuMemAlloc memory is uninitialized

    Block fresh = lease(4096, true, "h");

    assertFalse(hit(fresh));
    // The pool scrubs every new segment whole on such a backend; the block is not zeroed again.
    assertEquals(List.of(new InMemoryBackend.ZeroCall(
        (InMemoryBackend.FakeSegment) fresh.memory(), 0, 2 * MiB)), backend.zeroCalls());
    assertTrue(InMemoryBackend.isZero(fresh.memory(), fresh.offset(), fresh.size()));
  }

  @Test
  void lease_zeroOnLargeHit_zeroesTheWholeBlock() {
    release(lease(4 * MiB));

    Block b = lease(3 * MiB, true, "h");

    assertEquals(4 * MiB, b.size(), "no split, so the block is the whole 4 MiB");
    assertEquals(List.of(new InMemoryBackend.ZeroCall(
        (InMemoryBackend.FakeSegment) b.memory(), 0, 4 * MiB)), backend.zeroCalls());
  }

  @Test
  void lease_zeroFails_returnsTheBlockAndRethrows() {
    release(lease(4096));
    BackendException failure = new BackendException("scripted: memset failed");
    backend.failNextZero(failure);

    BackendException thrown = assertThrows(BackendException.class, () -> pool.lease(4096, true, "h", SegmentOwner.DAEMON));

    assertSame(failure, thrown);
    assertEquals(0, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(0, stats().get(PoolMetric.ACTIVE_LEASES));
    // The pool served the block (a hit) and took it back (a return): account for both.
    checked.countServedAndReturnedByPool(1);
    Block next = lease(4096);
    assertTrue(hit(next), "the block is reusable");
  }

  // --------------------------------------------------------------------------- the checker

  @Test
  void verifyInvariants_detectsACorruptedBlockList() {
    Block a = lease(4096);
    lease(4096);
    long size = a.size;
    a.size = 8192; // now overlaps its neighbour
    try {
      AssertionError e = assertThrows(AssertionError.class, pool::verifyInvariants);
      assertTrue(e.getMessage().startsWith("pool invariant:"), e.getMessage());
    } finally {
      a.size = size;
    }
  }

  @Test
  void release_ofABlockNotLeased_isRefusedAndChangesNothing() {
    Block a = lease(4096);
    release(a);
    PoolStats before = stats();

    assertThrows(IllegalStateException.class, () -> pool.release(a, null));

    assertEquals(before, stats());
  }
}
