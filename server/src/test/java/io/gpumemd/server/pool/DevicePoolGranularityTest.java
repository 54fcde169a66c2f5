package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.books.Validation;
import org.junit.jupiter.api.Test;

/**
 * New segments are multiples of the backend's segment granularity (CUDA VMM: 2 MiB on an H100,
 * more on other parts), on a backend that refuses any other size as {@code cuMemCreate} does.
 */
class DevicePoolGranularityTest extends PoolTestBase {

  private void useGranularity(long granularity) {
    InMemoryBackend b = new InMemoryBackend(1, 256 * MiB, true).withSegmentGranularity(granularity);
    use(new CheckedPool(b, new PoolSettings(256 * MiB, 256 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE)));
  }

  @Test
  void segmentBytes_roundsTheSizeClassSegmentUpToTheGranularity() {
    assertEquals(2 * MiB, Miss.segmentBytes(4096, 1));
    assertEquals(2 * MiB, Miss.segmentBytes(4096, 2 * MiB));
    assertEquals(6 * MiB, Miss.segmentBytes(5 * MiB, 2 * MiB));
    assertEquals(8 * MiB, Miss.segmentBytes(4096, 8 * MiB), "a small segment grows to the granularity");
    assertEquals(24 * MiB, Miss.segmentBytes(17 * MiB, 8 * MiB));
    assertEquals(9 * MiB, Miss.segmentBytes(7 * MiB, 3 * MiB), "any granularity, not only powers of two");
  }

  @Test
  void lease_withALargeGranularity_allocatesWholeGranules() {
    useGranularity(8 * MiB);

    Block small = lease(4096);
    Block large = lease(9 * MiB);

    assertEquals(8 * MiB, small.segmentBytes());
    assertEquals(16 * MiB, large.segmentBytes());
    assertEquals(9 * MiB, large.size(), "the lease keeps its own size; the rest stays free in the segment");
    assertEquals(24 * MiB, backend.liveBytes());
    assertEquals(24 * MiB, stats().get(PoolMetric.RESERVED_BYTES));
    assertTrue(backend.errors().isEmpty(), backend.errors().toString());
  }

  @Test
  void lease_withALargeGranularity_servesLaterLeasesFromWhatRoundingAdded() {
    useGranularity(8 * MiB);
    Block first = lease(4096);

    Block second = lease(1 * MiB);

    assertTrue(hit(second), "the 8 MiB small segment has room for it");
    assertEquals(first.segmentId(), second.segmentId());
    assertEquals(1, backend.allocs());
  }

  @Test
  void lease_withTheDefaultGranularity_keepsTheSizeClassSegments() {
    Block large = lease(3 * MiB);

    assertEquals(4 * MiB, large.segmentBytes());
  }

  @Test
  void pool_refusesAGranularityBelowOne() {
    InMemoryBackend b = new InMemoryBackend(1, 64 * MiB, false).withSegmentGranularity(0);

    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> new DevicePool(b.devices().get(0), b, new PoolSettings(64 * MiB, 0, 0), new RecordingHolders(),
            DevicePools.segmentIdBase(0), io.gpumemd.common.Ticker.system()));
    assertTrue(e.getMessage().contains("granularity"), e.getMessage());
  }

  @Test
  void aRequestUnderTheBudgetWhoseSegmentIsOverIt_isABadRequest_notAnExhaustedPool() {
    InMemoryBackend b = new InMemoryBackend(1, 256 * MiB, true).withSegmentGranularity(8 * MiB);
    use(new CheckedPool(b, new PoolSettings(20 * MiB, 20 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE)));

    assertEquals(16 * MiB, Validation.leaseSize(16 * MiB, pool), "a 16 MiB segment fits");
    InvalidRequestException e = assertThrows(InvalidRequestException.class,
        () -> Validation.leaseSize(17 * MiB, pool)); // under the 20 MiB budget; its segment is 24 MiB

    assertTrue(e.getMessage().contains("size_bytes: 17825792"), e.getMessage());
    assertTrue(e.getMessage().contains("needs a segment of " + 24 * MiB + " bytes"), e.getMessage());
    assertTrue(e.getMessage().contains("8.0 MiB granularity"), e.getMessage());
    assertEquals(0, backend.allocs(), "nothing was tried");
  }
}
