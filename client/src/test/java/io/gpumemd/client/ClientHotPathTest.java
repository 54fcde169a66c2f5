package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.Await;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The client's hot path against a live daemon: the client cache tier (local reuse, zeroing,
 * returns the daemon asks for), leases and releases on the session stream (per-request
 * errors, release notices), and the unary path as it was. Each test gets its own daemon; after
 * each, every client is closed and the daemon's pools must be empty and consistent.
 */
class ClientHotPathTest {
  private static final long KiB = 1 << 10;

  private TestDaemon daemon;
  private final List<GpuMemClient> clients = new ArrayList<>();

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    try {
      clients.forEach(GpuMemClient::close);
      Await.until(() -> daemon.server().registry().sessionCount() == 0, "every session ended");
      for (DevicePool pool : daemon.server().pools().all()) {
        assertEquals(0, pool.stats().get(PoolMetric.LEASED_BYTES), "leased bytes after the clients closed");
        assertEquals(0, pool.stats().get(PoolMetric.CLIENT_CACHED_BYTES), "client-cached bytes after the clients closed");
      }
      daemon.verifyInvariants();
    } finally {
      daemon.close();
    }
  }

  private GpuMemClient client(GpuMemClient.Builder builder) {
    GpuMemClient client = builder.connect();
    clients.add(client);
    return client;
  }

  private GpuMemClient client() {
    return client(GpuMemClient.builder(daemon.unixTarget()));
  }

  private long pool(PoolMetric metric) {
    return daemon.server().pools().get(0).stats().get(metric);
  }

  @Test
  void lease_afterClose_isALocalHit_sameLease_noDaemonRoundTrip() {
    GpuMemClient client = client();
    Lease first = client.lease(0, 64 * KiB);
    assertFalse(first.localHit());
    String id = first.id();
    first.close();
    Await.until(() -> pool(PoolMetric.CLIENT_CACHED_BYTES) == 64 * KiB, "the daemon hears the lease is client-cached");
    assertEquals(0, pool(PoolMetric.LEASED_BYTES));
    long daemonServed = pool(PoolMetric.HITS) + pool(PoolMetric.MISSES);

    Lease second = client.lease(0, 60 * KiB, false, "again");
    assertTrue(second.localHit());
    assertTrue(second.poolHit());
    assertEquals(id, second.id());
    assertEquals(60 * KiB, second.sizeBytes());
    assertEquals(64 * KiB, second.blockBytes(), "the block keeps its size");
    assertEquals("again", second.tag());
    assertEquals(60 * KiB, second.buffer().capacity());
    assertEquals(daemonServed, pool(PoolMetric.HITS) + pool(PoolMetric.MISSES), "the daemon served nothing");
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 64 * KiB && pool(PoolMetric.CLIENT_CACHED_BYTES) == 0,
        "the daemon hears the lease is leased again");

    ClientStats stats = client.stats();
    assertEquals(1, stats.localHits());
    assertEquals(1, stats.localReturns());
    assertEquals(1, stats.daemonLeases());
    assertEquals(0, stats.releases());
    assertEquals(0, stats.cachedBytes());
    assertEquals(0, stats.cachedBlocks());
    assertEquals(64L << 20, stats.allowanceBytes(), "the daemon's default allowance");
    Await.until(() -> pool(PoolMetric.CLIENT_CACHE_HITS) == 1 && pool(PoolMetric.CLIENT_CACHE_RETURNS) == 1,
        "the client's counters reach the daemon");

    second.close();
    assertEquals(64 * KiB, client.stats().cachedBytes());
    assertEquals(1, client.stats().cachedBlocks());
  }

  @Test
  void closedLease_refusesUse_andACachedBlockIsHandedOutAsANewLeaseObject() {
    GpuMemClient client = client();
    Lease first = client.lease(0, 4 * KiB);
    first.close();
    first.close(); // idempotent: cached once
    assertEquals(1, client.stats().localReturns());
    IllegalStateException e = assertThrows(IllegalStateException.class, first::buffer);
    assertTrue(e.getMessage().contains(first.id()) && e.getMessage().contains("closed"), e.getMessage());
    Lease second = client.lease(0, 4 * KiB);
    assertTrue(second.localHit());
    assertNotEquals(first, second);
    assertTrue(first.isClosed(), "the old handle stays closed");
    assertThrows(IllegalStateException.class, first::buffer);
    second.buffer().put(0, (byte) 1);
    second.close();
  }

  @Test
  void zeroLease_servedLocally_isZeroed() {
    GpuMemClient client = client();
    Lease dirty = client.lease(0, 8 * KiB);
    ByteBuffer memory = dirty.buffer();
    for (int i = 0; i < memory.capacity(); i++) {
      memory.put(i, (byte) 0xA5);
    }
    dirty.close();
    Lease clean = client.lease(0, 8 * KiB, true, "zeroed");
    assertTrue(clean.localHit());
    assertEquals(dirty.id(), clean.id());
    ByteBuffer zeroed = clean.buffer();
    for (int i = 0; i < zeroed.capacity(); i++) {
      assertEquals(0, zeroed.get(i), "byte " + i);
    }
    clean.close();
    Lease notZeroed = client.lease(0, 8 * KiB);
    assertTrue(notZeroed.localHit());
    notZeroed.close();
  }

  @Test
  void returnCache_fromATrim_releasesCachedBlocks_andTheDaemonEvictsThem() {
    GpuMemClient client = client();
    Lease a = client.lease(0, 64 * KiB);
    Lease b = client.lease(0, 4 << 20);
    a.close();
    b.close();
    Await.until(() -> pool(PoolMetric.CLIENT_CACHED_BYTES) == 64 * KiB + (4 << 20), "both client-cached");

    // Trim asks the clients for their cached blocks (ReturnCache) and waits for them.
    daemon.server().pools().get(0).trim(0);

    assertEquals(0, pool(PoolMetric.CLIENT_CACHED_BYTES));
    // Evicted segments are freed once the client has unmapped them (UnmapSegment, then its ack).
    Await.until(() -> pool(PoolMetric.RESERVED_BYTES) == 0, "everything given back is freed");
    assertEquals(0, client.mappedSegments());
    ClientStats stats = client.stats();
    assertEquals(0, stats.cachedBytes());
    assertEquals(0, stats.cachedBlocks());
    assertEquals(2, stats.releases());
    Lease fresh = client.lease(0, 64 * KiB);
    assertFalse(fresh.localHit(), "nothing cached any more");
    fresh.close();
  }

  @Test
  void streamErrors_arePerRequest_withTheUnaryCallsCodeAndMessage() throws Exception {
    GpuMemClient client = client();
    GpuMemClient unary = client(GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true));

    CompletableFuture<Lease> bad = client.leaseAsync(0, -1, false, "bad");
    CompletableFuture<Lease> good = client.leaseAsync(0, 4 * KiB, false, "good");
    ExecutionException failed = assertThrows(ExecutionException.class, () -> bad.get(5, TimeUnit.SECONDS));
    GpuMemException onStream = (GpuMemException) failed.getCause();
    assertEquals(Status.Code.INVALID_ARGUMENT, onStream.code());
    GpuMemException onUnary = assertThrows(GpuMemException.class, () -> unary.lease(0, -1, false, "bad"));
    assertEquals(onUnary.getMessage(), onStream.getMessage());
    good.get(5, TimeUnit.SECONDS).close();

    GpuMemException unknownDevice = assertThrows(GpuMemException.class, () -> client.lease(7, 4 * KiB));
    assertEquals(Status.Code.INVALID_ARGUMENT, unknownDevice.code());
    GpuMemException tooBig = assertThrows(GpuMemException.class, () -> client.lease(0, 1L << 40));
    assertEquals(unary.lease(0, 4 * KiB).getClass(), Lease.class);
    assertEquals(assertThrows(GpuMemException.class, () -> unary.lease(0, 1L << 40)).getMessage(), tooBig.getMessage());

    Lease after = client.lease(0, 8 * KiB); // the stream carries on
    after.close();
    assertEquals(2, client.stats().daemonLeases());
  }

  @Test
  void manyOutstandingLeases_onTheStream_allAnswered() throws Exception {
    GpuMemClient client = client(GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0));
    List<CompletableFuture<Lease>> pending = new ArrayList<>();
    for (int i = 0; i < 100; i++) {
      pending.add(client.leaseAsync(i % 2, 4 * KiB + i * 512L, false, "n" + i));
    }
    for (CompletableFuture<Lease> f : pending) {
      f.get(5, TimeUnit.SECONDS).close();
    }
    assertEquals(100, client.stats().daemonLeases());
    assertEquals(100, client.stats().releases());
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the release notices arrive");
  }

  @Test
  void close_withoutRoomInTheCache_isAReleaseNotice_notWaitedFor() {
    GpuMemClient client = client(GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(16 * KiB));
    assertEquals(16 * KiB, client.stats().allowanceBytes(), "the allowance asked for");
    Lease big = client.lease(0, 64 * KiB);
    Lease small = client.lease(0, 8 * KiB);
    big.close();
    small.close();
    assertEquals(1, client.stats().releases());
    assertEquals(8 * KiB, client.stats().cachedBytes());
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0 && pool(PoolMetric.CLIENT_CACHED_BYTES) == 8 * KiB,
        "big released, small client-cached");
  }

  @Test
  void clientCacheBytesZero_turnsTheTierOff() {
    GpuMemClient client = client(GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0));
    Lease first = client.lease(0, 4 * KiB);
    first.close();
    Lease second = client.lease(0, 4 * KiB);
    assertFalse(second.localHit());
    assertTrue(second.poolHit(), "the daemon's cache served it");
    second.close();
    ClientStats stats = client.stats();
    assertEquals(new ClientStats(0, 0, 2, 2, 0, 0, 0), stats);
    assertEquals(0, daemon.server().registry().sessions(Caller.DAEMON).get(0).cacheAllowance());
  }

  @Test
  void unaryCalls_leaseAndReleaseAsBefore_noClientCache() throws Exception {
    GpuMemClient client = client(GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true));
    Lease first = client.lease(0, 4 * KiB);
    assertEquals(4 * KiB, pool(PoolMetric.LEASED_BYTES));
    first.close();
    assertEquals(0, pool(PoolMetric.LEASED_BYTES), "released before close() returned");
    Lease second = client.leaseAsync(0, 4 * KiB, false, "").get(5, TimeUnit.SECONDS);
    assertFalse(second.localHit());
    second.closeAsync().get(5, TimeUnit.SECONDS);
    assertEquals(0, pool(PoolMetric.LEASED_BYTES));
    assertEquals(new ClientStats(0, 0, 2, 2, 0, 0, 0), client.stats());
  }

  @Test
  void releaseFailed_isLoggedWithTheLeaseId() {
    GpuMemClient client = client(GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0));
    Lease lease = client.lease(0, 4 * KiB);
    // The daemon side lets it go behind the client's back: the client's release then fails.
    // (as the session's own tenant: the daemon's in-process identity owns no client's session)
    String tenant = daemon.server().registry().sessions(Caller.DAEMON).stream()
        .filter(s -> s.id().equals(client.sessionId())).findFirst().orElseThrow().tenant();
    Caller owner = new Caller(tenant, "test", false, Caller.UNKNOWN, Caller.UNKNOWN, Caller.UNKNOWN, "test");
    daemon.server().registry().release(owner, client.sessionId(), lease.id(), new byte[0]);
    try (LogCapture log = new LogCapture(GpuMemClient.class)) {
      lease.close();
      Await.until(() -> log.messages("WARN").stream().anyMatch(m -> m.contains(lease.id()) && m.contains("NOT_FOUND")),
          "a WARN naming the lease");
    }
    Lease next = client.lease(0, 4 * KiB); // the stream carries on
    next.close();
  }

  @Test
  void closingTheClient_withCachedBlocks_endsTheSessionWithNothingHeld() {
    GpuMemClient client = client();
    List<Lease> leases = new ArrayList<>();
    for (int i = 1; i <= 8; i++) {
      leases.add(client.lease(i % 2, i * 16 * KiB));
    }
    leases.forEach(Lease::close);
    assertEquals(8, client.stats().cachedBlocks());
    client.close();
    assertEquals(0, client.mappedSegments());
    assertEquals(0, client.stats().cachedBlocks());
    // stop() checks that the daemon holds nothing for the session.
  }
}
