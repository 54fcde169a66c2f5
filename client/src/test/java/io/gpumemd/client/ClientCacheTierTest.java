package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The client cache tier and the session stream against a live daemon: local reuse without a
 * round trip, zero honoured locally, the daemon's view of cached blocks, errors per request on
 * the stream, and the tier switched off.
 */
class ClientCacheTierTest {
  private TestDaemon daemon;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--client-cache-bytes", "16MiB");
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  private DevicePool pool() {
    return daemon.server().pools().get(0);
  }

  /** Waits (bounded) until the daemon has heard the client's notices. */
  private void awaitDaemon(PoolMetric metric, long value) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
    while (pool().stats().get(metric) != value && System.nanoTime() < deadline) {
      Thread.sleep(1);
    }
    assertEquals(value, pool().stats().get(metric), metric.toString());
  }

  @Test
  void closedLease_servesTheNextLocally_sameBlock_noRoundTrip() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      assertEquals(16L << 20, client.stats().allowanceBytes());
      Lease first = client.lease(0, 1 << 20);
      String id = first.id();
      first.buffer().putLong(0, 42);
      first.close();
      awaitDaemon(PoolMetric.CLIENT_CACHED_BYTES, 1 << 20);
      assertEquals(0, pool().stats().get(PoolMetric.LEASED_BYTES));

      try (Lease second = client.lease(0, 1000 * 1000)) {
        assertTrue(second.localHit() && second.poolHit(), second.toString());
        assertEquals(id, second.id(), "the same lease, handed out again");
        assertEquals(1000 * 1000, second.sizeBytes());
        assertEquals(42, second.buffer().getLong(0), "the same bytes: contents unspecified, not cleared");
        assertEquals(1, client.stats().localHits());
        assertEquals(1, client.stats().daemonLeases(), "only the first lease went to the daemon");
        awaitDaemon(PoolMetric.LEASED_BYTES, 1 << 20);
        assertEquals(0, pool().stats().get(PoolMetric.CLIENT_CACHED_BYTES));
      }
      assertThrows(IllegalStateException.class, first::buffer, "a closed lease stays closed");
    }
    assertEquals(1, pool().stats().get(PoolMetric.CLIENT_CACHE_HITS), "reported to the daemon");
    assertEquals(0, pool().stats().get(PoolMetric.LEASED_BYTES) + pool().stats().get(PoolMetric.CLIENT_CACHED_BYTES));
  }

  @Test
  void zeroLease_servedLocally_isZeroed() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      try (Lease dirty = client.lease(0, 256 << 10)) {
        ByteBuffer b = dirty.buffer();
        for (int i = 0; i < b.capacity(); i += 8) {
          b.putLong(i, -1L);
        }
      }
      try (Lease clean = client.lease(0, 256 << 10, true, "zeroed")) {
        assertTrue(clean.localHit());
        ByteBuffer b = clean.buffer();
        for (int i = 0; i < b.capacity(); i += 8) {
          assertEquals(0, b.getLong(i), "byte " + i + " of a zero lease");
        }
      }
    }
  }

  @Test
  void badRequestOnTheStream_failsAlone_withTheUnaryStatus() throws Exception {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      CompletableFuture<Lease> good = client.leaseAsync(0, 4096, false, "good");
      CompletableFuture<Lease> bad = client.leaseAsync(0, 1L << 40, false, "bad");
      GpuMemException e = assertThrows(GpuMemException.class, () -> client.lease(7, 4096));
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertTrue(e.getMessage().contains("device: 7 (expected: 0..1)"), e.getMessage());
      Throwable why = assertThrows(java.util.concurrent.ExecutionException.class, () -> bad.get(5, TimeUnit.SECONDS)).getCause();
      assertEquals(Status.Code.INVALID_ARGUMENT, ((GpuMemException) why).code());
      assertTrue(why.getMessage().contains("the budget of device 0"), why.getMessage());
      try (Lease lease = good.get(5, TimeUnit.SECONDS)) {
        assertEquals(4096, lease.sizeBytes());
      }
      try (Lease after = client.lease(0, 8192)) {
        assertFalse(after.localHit(), "the tier is off: the daemon served it");
        assertEquals(0, client.stats().localHits());
      }
    }
  }

  @Test
  void leaseInterruptedWhileWaiting_isGivenBackWhenGranted() throws Exception {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      Thread.currentThread().interrupt(); // the wait for the reply ends at once
      GpuMemException e = assertThrows(GpuMemException.class, () -> client.lease(0, 4096));
      assertTrue(Thread.interrupted(), "the interrupt is kept for the caller");
      assertEquals(Status.Code.CANCELLED, e.code());
      // The daemon granted it anyway; the client gives it back without anyone holding it.
      awaitDaemon(PoolMetric.RETURNS, 1);
      assertEquals(0, pool().stats().get(PoolMetric.LEASED_BYTES));
      assertEquals(1, client.stats().releases());
    }
  }

  @Test
  void unaryCalls_releaseSynchronously_andCacheNothing() {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      client.lease(0, 4096).close();
      assertEquals(0, pool().stats().get(PoolMetric.LEASED_BYTES), "released by the time close() returned");
      assertEquals(1, pool().stats().get(PoolMetric.RETURNS));
      assertEquals(0, client.stats().allowanceBytes());
      assertEquals(2, client.stats().daemonLeases() + client.stats().releases());
    }
  }
}
