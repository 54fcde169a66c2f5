package io.gpumemd.server.session;

import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.common.Ticker;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.DrainingException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Ownership rules of the session registry over real host-backend pools, with a fake clock so
 * TTL, grace and leak thresholds are tested without sleeping.
 */
class SessionRegistryTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;

  /** A channel that records what the server pushed. */
  private void start(SessionSettings settings) {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(64 * MIB, 64 * MIB, 20 * MIB), sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, settings, ticker, sessions);
  }

  private void start() {
    start(new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of()));
  }

  @AfterEach
  void verifyAndClose() {
    if (pools != null) {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  private PoolStats stats() {
    return pools.get(0).stats();
  }

  private long segmentFiles() throws IOException {
    try (Stream<Path> files = Files.list(dir.resolve("shm").resolve("dev0"))) {
      return files.count();
    }
  }

  @Test
  void ttlExpiry_withoutStream_returnsEverything() {
    start();
    Session s = registry.open(Caller.DAEMON, "grpcurl", 5, -1);
    registry.lease(Caller.DAEMON, s.id(), 0, MIB, false, "a", false);
    registry.lease(Caller.DAEMON, s.id(), 0, 3 * MIB, false, "b", false);
    ticker.advance(4, TimeUnit.SECONDS);
    registry.reap();
    assertEquals(2, registry.liveLeases(), "still within the TTL");
    registry.session(Caller.DAEMON, s.id()); // any call refreshes the TTL
    ticker.advance(4, TimeUnit.SECONDS);
    registry.reap();
    assertEquals(2, registry.liveLeases(), "TTL was refreshed 4 s ago");
    ticker.advance(2, TimeUnit.SECONDS);
    registry.reap();
    assertEquals(0, registry.liveLeases());
    assertEquals(0, stats().get(PoolMetric.LEASED_BYTES));
    assertThrows(NotFoundException.class, () -> registry.session(Caller.DAEMON, s.id()));
  }

  @Test
  void streamClosed_reattachWithinGrace_keepsLeases() {
    start();
    Session s = registry.open(Caller.DAEMON, "worker", 5, -1);
    RecordingChannel first = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), first);
    registry.lease(Caller.DAEMON, s.id(), 0, MIB, false, "", false);
    registry.detach(s, first);
    ticker.advance(1999, TimeUnit.MILLISECONDS);
    registry.reap();
    assertEquals(1, registry.liveLeases());
    registry.attach(Caller.DAEMON, s.id(), new RecordingChannel());
    ticker.advance(1, TimeUnit.HOURS); // with a stream attached neither grace nor TTL applies
    registry.reap();
    assertEquals(1, registry.liveLeases());
  }

  @Test
  void streamClosed_pastGrace_endsSessionAndLogsWhatItHeld() {
    start();
    try (LogCapture log = new LogCapture(SessionRegistry.class)) {
      Session s = registry.open(Caller.DAEMON, "worker-7", 0, -1);
      RecordingChannel channel = new RecordingChannel();
      registry.attach(Caller.DAEMON, s.id(), channel);
      registry.lease(Caller.DAEMON, s.id(), 0, 4096, false, "", false);
      registry.lease(Caller.DAEMON, s.id(), 0, 8192, false, "", false);
      registry.detach(s, channel);
      ticker.advance(2001, TimeUnit.MILLISECONDS);
      registry.reap();
      assertEquals(0, registry.liveLeases());
      String ended = log.messages("INFO").stream().filter(m -> m.contains("ended")).findFirst().orElseThrow();
      assertTrue(ended.contains("worker-7") && ended.contains("released 2 leases, 12288 bytes")
          && ended.contains("KeepAlive stream closed"), ended);
    }
  }

  @Test
  void newStream_replacesAndClosesThePreviousOne() {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    RecordingChannel first = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), first);
    registry.attach(Caller.DAEMON, s.id(), new RecordingChannel());
    assertTrue(first.closed);
    registry.detach(s, first); // the old stream's end must not detach the new one
    ticker.advance(1, TimeUnit.HOURS);
    registry.reap();
    registry.session(Caller.DAEMON, s.id());
  }

  @Test
  void closeSession_releasesEverything_andEndsTheStream() {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    RecordingChannel channel = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), channel);
    for (int i = 0; i < 5; i++) {
      registry.lease(Caller.DAEMON, s.id(), 0, (i + 1) * 100_000L, false, "", false);
    }
    long[] released = registry.close(Caller.DAEMON, s.id());
    assertEquals(5, released[0]);
    assertEquals(0, stats().get(PoolMetric.LEASED_BYTES));
    assertTrue(channel.closed);
    assertThrows(NotFoundException.class, () -> registry.close(Caller.DAEMON, s.id()));
  }

  @Test
  void foreignAndDoubleRelease_areNotFound_andChangeNothing() {
    start();
    Session owner = registry.open(Caller.DAEMON, "owner", 0, -1);
    Session other = registry.open(Caller.DAEMON, "other", 0, -1);
    LeaseRecord lease = registry.lease(Caller.DAEMON, owner.id(), 0, MIB, false, "", false);
    PoolStats before = stats();
    NotFoundException foreign = assertThrows(NotFoundException.class,
        () -> registry.release(Caller.DAEMON, other.id(), lease.id(), new byte[0]));
    assertTrue(foreign.getMessage().contains(lease.id()));
    assertEquals(before, stats());
    assertEquals(1, registry.liveLeases());
    registry.release(Caller.DAEMON, owner.id(), lease.id(), new byte[0]);
    PoolStats afterRelease = stats();
    assertThrows(NotFoundException.class, () -> registry.release(Caller.DAEMON, owner.id(), lease.id(), new byte[0]));
    assertEquals(afterRelease, stats());
    assertThrows(NotFoundException.class,
        () -> registry.release(Caller.DAEMON, owner.id(), SecureIds.next(), new byte[0]));
  }

  @Test
  void malformedIds_areInvalidArgument() {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    assertThrows(InvalidRequestException.class, () -> registry.session(Caller.DAEMON, "nope"));
    assertThrows(InvalidRequestException.class, () -> registry.session(Caller.DAEMON, s.id().toUpperCase()));
    InvalidRequestException e = assertThrows(InvalidRequestException.class,
        () -> registry.release(Caller.DAEMON, s.id(), "not-a-lease", new byte[0]));
    assertTrue(e.getMessage().startsWith("lease_id: 'not-a-lease' (expected: 32 lowercase hex"), e.getMessage());
  }

  @Test
  void quotas_refuseWithTheQuotaNamed_andPerClientOverridesApply() {
    start(new SessionSettings(30, 3600, 2000, 0, new Quota(0, 2),
        Map.of("big", new Quota(4 * MIB, 0))));
    Session small = registry.open(Caller.DAEMON, "small", 0, -1);
    registry.lease(Caller.DAEMON, small.id(), 0, 4096, false, "", false);
    registry.lease(Caller.DAEMON, small.id(), 0, 4096, false, "", false);
    ExhaustedException count = assertThrows(ExhaustedException.class,
        () -> registry.lease(Caller.DAEMON, small.id(), 0, 4096, false, "", false));
    assertTrue(count.getMessage().contains("max-leases=2"), count.getMessage());

    Session big = registry.open(Caller.DAEMON, "big", 0, -1);
    for (int i = 0; i < 4; i++) {
      registry.lease(Caller.DAEMON, big.id(), 0, MIB, false, "", false); // no lease-count quota for "big"
    }
    PoolStats before = stats();
    ExhaustedException bytes = assertThrows(ExhaustedException.class,
        () -> registry.lease(Caller.DAEMON, big.id(), 0, 512, false, "", false));
    assertTrue(bytes.getMessage().contains("max-leased-bytes=" + 4 * MIB), bytes.getMessage());
    assertEquals(before, stats(), "a refused lease changes nothing");
  }

  @Test
  void leakThreshold_warnsOnce_andReportsTheReturn() {
    start(new SessionSettings(30, 3600, 2000, 60_000, Quota.UNLIMITED, Map.of()));
    try (LogCapture log = new LogCapture(SessionRegistry.class)) {
      Session s = registry.open(Caller.DAEMON, "leaky", 0, -1);
      registry.attach(Caller.DAEMON, s.id(), new RecordingChannel());
      LeaseRecord lease = registry.lease(Caller.DAEMON, s.id(), 0, 12345, false, "kv-cache", false);
      ticker.advance(59, TimeUnit.SECONDS);
      registry.reap();
      assertTrue(log.messages("WARN").isEmpty());
      ticker.advance(6, TimeUnit.SECONDS); // leases are scanned every threshold/10 (capped at 5 s)
      registry.reap();
      ticker.advance(6, TimeUnit.SECONDS);
      registry.reap();
      List<String> warnings = log.messages("WARN");
      assertEquals(1, warnings.size(), "warned once: " + warnings);
      String w = warnings.get(0);
      assertTrue(w.contains(lease.id()) && w.contains("leaky") && w.contains("device 0")
          && w.contains("12345 bytes") && w.contains("kv-cache") && w.contains("65000 ms"), w);
      registry.release(Caller.DAEMON, s.id(), lease.id(), new byte[0]);
      assertTrue(log.messages("INFO").stream().anyMatch(m -> m.contains(lease.id()) && m.contains("returned")));
    }
  }

  @Test
  void draining_refusesNewWork_andTellsAttachedClients() {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    RecordingChannel channel = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), channel);
    LeaseRecord held = registry.lease(Caller.DAEMON, s.id(), 0, 4096, false, "", false);
    registry.beginDrain(1500);
    assertEquals(1500, channel.shutdownDrainMillis);
    assertThrows(DrainingException.class, () -> registry.lease(Caller.DAEMON, s.id(), 0, 4096, false, "", false));
    assertThrows(DrainingException.class, () -> registry.open(Caller.DAEMON, "late", 0, -1));
    registry.release(Caller.DAEMON, s.id(), held.id(), new byte[0]); // releasing is still allowed
    assertEquals(0, registry.liveLeases());
  }

  @Test
  void evictingAMappedSegment_waitsForTheClientsUnmap() throws IOException {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    RecordingChannel channel = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), channel);
    LeaseRecord lease = registry.lease(Caller.DAEMON, s.id(), 0, 4 * MIB, false, "", false);
    long segment = lease.block().segmentId();
    registry.release(Caller.DAEMON, s.id(), lease.id(), new byte[0]);
    assertEquals(1, segmentFiles());
    pools.get(0).setRetentionCap(0);
    assertEquals(List.of(segment), channel.unmapRequests);
    assertEquals(1, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(1, segmentFiles(), "not freed while the client may still map it");
    registry.unmapped(s, List.of(segment));
    assertEquals(0, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(0, stats().get(PoolMetric.RESERVED_BYTES));
    assertEquals(0, segmentFiles());
  }

  @Test
  void evictingAMappedSegment_isFreedWhenTheSessionEnds() throws IOException {
    start();
    Session a = registry.open(Caller.DAEMON, "a", 0, -1);
    Session b = registry.open(Caller.DAEMON, "b", 0, -1);
    registry.attach(Caller.DAEMON, a.id(), new RecordingChannel());
    LeaseRecord la = registry.lease(Caller.DAEMON, a.id(), 0, 4096, false, "", false);
    registry.release(Caller.DAEMON, a.id(), la.id(), new byte[0]);
    LeaseRecord lb = registry.lease(Caller.DAEMON, b.id(), 0, 4096, false, "", false);
    assertEquals(la.block().segmentId(), lb.block().segmentId());
    registry.release(Caller.DAEMON, b.id(), lb.id(), new byte[0]);
    pools.get(0).trim(0);
    assertEquals(1, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    registry.unmapped(a, List.of(la.block().segmentId()));
    assertEquals(1, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "b (no stream) may still have it mapped");
    registry.close(Caller.DAEMON, b.id());
    assertEquals(0, stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(0, segmentFiles());
  }

  @Test
  void leaseIds_andSessionIds_areUnguessable128BitHex() {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    LeaseRecord a = registry.lease(Caller.DAEMON, s.id(), 0, 512, false, "", false);
    LeaseRecord b = registry.lease(Caller.DAEMON, s.id(), 0, 512, false, "", false);
    assertTrue(a.id().matches("[0-9a-f]{32}"));
    assertNotEquals(a.id(), b.id());
    assertNotEquals(a.id().substring(0, 16), b.id().substring(0, 16));
  }

  @Test
  void cachedOnlyLease_returnsNullOnAMiss_andReservesNothing() {
    start(new SessionSettings(30, 3600, 2000, 0, new Quota(0, 1), Map.of()));
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    assertNull(registry.lease(Caller.DAEMON, s.id(), 0, 4096, false, "", true));
    assertEquals(0, stats().get(PoolMetric.MISSES));
    LeaseRecord lease = registry.lease(Caller.DAEMON, s.id(), 0, 4096, false, "", false); // quota of 1 still free
    registry.release(Caller.DAEMON, s.id(), lease.id(), new byte[0]);
    LeaseRecord hit = registry.lease(Caller.DAEMON, s.id(), 0, 4096, false, "", true);
    assertTrue(hit.poolHit());
    assertFalse(registry.draining());
  }

  @Test
  void unmapRequestsMissedWhileDetached_areRepeatedOnReattach() throws IOException {
    start();
    Session s = registry.open(Caller.DAEMON, "w", 0, -1);
    RecordingChannel first = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), first);
    LeaseRecord lease = registry.lease(Caller.DAEMON, s.id(), 0, 4 * MIB, false, "", false);
    registry.release(Caller.DAEMON, s.id(), lease.id(), new byte[0]);
    registry.detach(s, first);
    pools.get(0).setRetentionCap(0); // asks while no stream is attached: nobody hears it
    assertTrue(first.unmapRequests.isEmpty());
    RecordingChannel second = new RecordingChannel();
    registry.attach(Caller.DAEMON, s.id(), second);
    assertEquals(List.of(lease.block().segmentId()), second.unmapRequests);
    registry.unmapped(s, second.unmapRequests);
    assertEquals(0, segmentFiles());
  }
}
