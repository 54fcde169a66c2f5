package io.gpumemd.it.e2e;

import io.gpumemd.server.pool.PoolMetric;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The client library against a real daemon on the host backend, over both listeners, on the
 * unary calls (the daemon sees every lease and release as it happens; the session stream and the
 * client cache tier are ClientCacheProcessTest's).
 */
class ClientLeaseTest {
  private TestDaemon daemon;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  private PoolStats stats(int device) {
    return daemon.server().pools().get(device).stats();
  }

  @Test
  void lease_overUnixSocket_sharesBytesWithAnotherClient() {
    try (GpuMemClient writer = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect();
         GpuMemClient reader = GpuMemClient.builder(daemon.tcpTarget()).unaryCalls(true).clientName("reader").connect()) {
      Lease lease = writer.lease(0, 4096);
      ByteBuffer buf = lease.buffer();
      assertEquals(4096, buf.capacity());
      for (int i = 0; i < 4096; i++) {
        buf.put(i, (byte) (i * 31));
      }
      lease.close();
      // The freed block is the best fit for the same size: the reader gets it and sees the bytes.
      try (Lease again = reader.lease(0, 4096)) {
        assertTrue(again.poolHit());
        assertEquals(lease.segmentId(), again.segmentId());
        assertEquals(lease.offset(), again.offset());
        ByteBuffer seen = again.buffer();
        for (int i = 0; i < 4096; i++) {
          assertEquals((byte) (i * 31), seen.get(i), "byte " + i);
        }
      }
    }
    PoolStats s = stats(0);
    assertEquals(1, s.get(PoolMetric.HITS));
    assertEquals(1, s.get(PoolMetric.MISSES));
    assertEquals(2, s.get(PoolMetric.RETURNS));
    assertEquals(0, s.get(PoolMetric.LEASED_BYTES));
  }

  @Test
  void lease_zeroTrue_clearsPreviousContents() {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      try (Lease dirty = client.lease(0, 8192)) {
        dirty.buffer().put(0, (byte) 7).put(8191, (byte) 9);
      }
      try (Lease clean = client.lease(0, 8192, true, "zeroed")) {
        assertTrue(clean.poolHit());
        assertEquals(0, clean.buffer().get(0));
        assertEquals(0, clean.buffer().get(8191));
      }
    }
  }

  @Test
  void poolHit_onMappedSegment_opensNoNewMapping() {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      for (int i = 0; i < 10; i++) {
        try (Lease lease = client.lease(0, 64 * 1024)) {
          lease.buffer().put(0, (byte) i);
        }
      }
      assertEquals(1, client.mapsOpened());
    }
  }

  @Test
  void close_isIdempotent_andClientCloseReleasesEverything() {
    GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect();
    Lease a = client.lease(0, 1 << 20);
    a.close();
    a.close();
    client.lease(1, 3 << 20);
    client.lease(1, 5000);
    assertEquals(2, daemon.server().registry().liveLeases());
    client.close();
    client.close();
    assertEquals(0, daemon.server().registry().liveLeases());
    assertEquals(0, stats(1).get(PoolMetric.LEASED_BYTES));
  }

  @Test
  void errors_keepStatusCodeAndServerMessage() {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      GpuMemException zero = assertThrows(GpuMemException.class, () -> client.lease(0, 0));
      assertEquals(Status.Code.INVALID_ARGUMENT, zero.code());
      assertTrue(zero.serverMessage().startsWith("size_bytes: 0"), zero.getMessage());
      GpuMemException device = assertThrows(GpuMemException.class, () -> client.lease(7, 10));
      assertEquals(Status.Code.INVALID_ARGUMENT, device.code());
      assertTrue(device.serverMessage().contains("device: 7"), device.getMessage());
      Lease big = client.lease(0, 200L << 20);
      GpuMemException full = assertThrows(GpuMemException.class, () -> client.lease(0, 100L << 20));
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, full.code());
      assertTrue(full.serverMessage().contains("limit=268435456"), full.getMessage());
      big.close();
    }
    assertEquals(1, stats(0).get(PoolMetric.OOMS));
    assertNotEquals(0, stats(0).get(PoolMetric.CACHED_BYTES));
    assertFalse(daemon.server().registry().draining());
  }

  @Test
  void evictingAMappedSegment_clientUnmapsOnRequest_thenTheDaemonFreesIt() throws Exception {
    daemon.close();
    daemon = TestDaemon.start("--host-segments", "path"); // counts segment files
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      client.lease(0, 4 << 20).close();
      assertEquals(1, client.mappedSegments());
      assertEquals(1, daemon.segmentFiles(0));
      daemon.server().pools().get(0).setRetentionCap(0);
      long deadline = System.nanoTime() + 5_000_000_000L;
      while ((stats(0).get(PoolMetric.SEGMENTS_AWAITING_UNMAP) > 0 || client.mappedSegments() > 0) && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      assertEquals(0, client.mappedSegments(), "the client closed its mapping");
      assertEquals(0, stats(0).get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "the client's acknowledgement arrived");
      assertEquals(0, stats(0).get(PoolMetric.RESERVED_BYTES));
      assertEquals(0, daemon.segmentFiles(0));
      // and the next lease maps a fresh segment
      try (Lease again = client.lease(0, 4 << 20)) {
        again.buffer().put(0, (byte) 1);
        assertEquals(1, client.mappedSegments());
      }
    }
  }

  @Test
  void missUnderBudgetPressure_waitsForAnotherClientToUnmapTheEvictedSegment() {
    try (TestDaemon small = TestDaemon.start("--host-devices", "1", "--device-limit-bytes", "8MiB");
         GpuMemClient first = GpuMemClient.builder(small.unixTarget()).unaryCalls(true).connect();
         GpuMemClient second = GpuMemClient.builder(small.unixTarget()).unaryCalls(true).connect()) {
      first.lease(0, 6 << 20).close(); // a 6 MiB segment stays cached, mapped by `first`
      // 7 MiB needs an 8 MiB segment: only fits once `first` has unmapped the cached one.
      try (Lease lease = second.lease(0, 7 << 20)) {
        assertFalse(lease.poolHit());
        lease.buffer().put(0, (byte) 1);
      }
      PoolStats s = small.server().pools().get(0).stats();
      assertEquals(0, s.get(PoolMetric.OOMS));
      assertEquals(1, s.get(PoolMetric.EVICTIONS));
      assertEquals(1, s.get(PoolMetric.ALLOC_RETRIES));
      assertEquals(0, first.mappedSegments(), "first unmapped the evicted segment when asked");
      small.verifyInvariants();
    }
  }

  @Test
  void aMissWaitingForUnmaps_doesNotHoldUpOtherMisses_andProceedsWhenTheMapperEnds() throws Exception {
    try (TestDaemon small = TestDaemon.start("--device-limit-bytes", "8MiB", "--unmap-wait-ms", "60000");
         GpuMemClient streamless = GpuMemClient.builder(small.unixTarget()).keepAlive(false).connect();
         GpuMemClient waiter = GpuMemClient.builder(small.unixTarget()).unaryCalls(true).connect();
         GpuMemClient other = GpuMemClient.builder(small.unixTarget()).unaryCalls(true).connect()) {
      streamless.lease(0, 6 << 20).close(); // cached, mapped by a session the daemon cannot ask
      java.util.concurrent.CompletableFuture<Lease> waiting = waiter.leaseAsync(0, 7 << 20, false, "");
      long deadline = System.nanoTime() + 10_000_000_000L;
      while (small.server().pools().get(0).stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP) == 0 && System.nanoTime() < deadline) {
        Thread.sleep(5);
      }
      assertEquals(1, small.server().pools().get(0).stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "the cached segment was evicted for the waiter");
      try (Lease unrelated = other.lease(1, 3 << 20)) { // another miss, served meanwhile
        assertFalse(unrelated.poolHit());
      }
      assertFalse(waiting.isDone(), "still waiting for the unmap");
      streamless.close(); // its session ends: the segment is freed and the waiter proceeds
      try (Lease lease = waiting.get(30, java.util.concurrent.TimeUnit.SECONDS)) {
        assertEquals(7 << 20, lease.sizeBytes());
      }
      assertEquals(0, small.server().pools().get(0).stats().get(PoolMetric.OOMS));
    }
  }
}
