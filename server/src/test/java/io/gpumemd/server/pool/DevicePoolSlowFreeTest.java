package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * A backend free takes time (deleting a large shared-memory file takes milliseconds): a miss
 * that the pool has already made room for, while the device still counts the memory being
 * freed, waits for the free instead of failing with "device memory exhausted".
 */
class DevicePoolSlowFreeTest extends PoolTestBase {
  @Test
  void missDuringASlowFreeOfTheSegmentItEvicted_waitsForTheFree() throws Exception {
    // Budget = device capacity: the pool's books and the device agree only once frees finish.
    use(new CheckedPool(new InMemoryBackend(1, 8 * MiB, true), new PoolSettings(8 * MiB, 8 * MiB, 20 * MiB, 5_000),
        false));
    Block big = lease(8 * MiB, false, "mapper");
    release(big);
    backend.onFree(segment -> sleep(50));
    checked.onUnmapRequest((holder, device, segmentId) ->
        CompletableFuture.runAsync(() -> pool.unmapped(holder, segmentId)));

    // A small lease needs a new 2 MiB segment: the idle 8 MiB one is evicted, "mapper" is asked
    // to unmap it, confirms on another thread, and the free takes 50 ms there.
    Block small = lease(4096, false, "other");
    assertFalse(hit(small));
    assertEquals(0, stats().get(PoolMetric.OOMS), "no spurious device-memory exhaustion");
    assertEquals(2 * MiB, stats().get(PoolMetric.RESERVED_BYTES));
    release(small);
    pool.holderEnded("mapper");
  }

  private static void sleep(long millis) {
    try {
      TimeUnit.MILLISECONDS.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
