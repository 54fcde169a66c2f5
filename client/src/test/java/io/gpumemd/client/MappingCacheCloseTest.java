package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.LogCapture;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * A mapping that fails to close (a CUDA unmap refused by the driver) neither stops the others
 * from closing nor withholds the unmap acknowledgement the daemon waits for. The failing mapping
 * is a stand-in: a real one needs a GPU.
 */
class MappingCacheCloseTest {
  private final List<Long> acked = new ArrayList<>();
  private final MappingCache cache = new MappingCache(acked::add, null, "session", Map.of());

  /** Counts its closes; throws on each when told to. */
  private static final class Mapping implements SegmentMapping {
    final boolean fails;
    int closes;

    Mapping(boolean fails) {
      this.fails = fails;
    }

    @Override
    public void close() {
      closes++;
      if (fails) {
        throw new GpuMemException(io.grpc.Status.Code.INTERNAL, "cuMemUnmap failed: CUDA_ERROR_INVALID_VALUE", null);
      }
    }
  }

  @Test
  void requestedUnmap_whoseCloseFails_isStillAcknowledged_andLogged() {
    Mapping failing = new Mapping(true);
    cache.track(7, failing);
    cache.release(7); // no lease left: kept for the next one
    try (LogCapture log = new LogCapture(GpuMemClient.class)) {
      cache.unmapRequested(7);
      assertTrue(log.messages("WARN").stream().anyMatch(m -> m.contains("segment 7") && m.contains("cuMemUnmap")),
          String.valueOf(log.messages("WARN")));
    }
    assertEquals(1, failing.closes);
    assertEquals(List.of(7L), acked, "acknowledged though the close failed");
    assertEquals(0, cache.size());
  }

  @Test
  void unmapWaitingForTheLastLease_whoseCloseFails_isStillAcknowledged() {
    Mapping failing = new Mapping(true);
    cache.track(8, failing);
    cache.unmapRequested(8); // a lease still uses it: later
    assertEquals(List.of(), acked);
    cache.release(8);
    assertEquals(1, failing.closes);
    assertEquals(List.of(8L), acked);
  }

  @Test
  void closeAll_closesEveryMapping_evenAfterOneFails() {
    Mapping failing = new Mapping(true);
    Mapping other = new Mapping(false);
    Mapping third = new Mapping(false);
    cache.track(1, failing);
    cache.track(2, other);
    cache.track(3, third);
    cache.closeAll();
    assertEquals(1, failing.closes);
    assertEquals(1, other.closes);
    assertEquals(1, third.closes);
    assertEquals(0, cache.size());
  }

  @Test
  void abandonAll_closesTheNonHostMappings_evenAfterOneFails() {
    Mapping failing = new Mapping(true);
    Mapping other = new Mapping(false);
    cache.track(1, failing);
    cache.track(2, other);
    cache.abandonAll();
    assertEquals(1, failing.closes);
    assertEquals(1, other.closes);
    assertEquals(0, cache.size());
  }
}
