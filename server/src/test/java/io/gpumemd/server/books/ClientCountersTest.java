package io.gpumemd.server.books;

import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.auth.Caller;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Client-reported cache counters (issue 22): whatever a client sends, the pool's shared figures
 * and a session's own stay non-negative. Negative values are ignored, deltas are never
 * negative, and every sum saturates at {@link Long#MAX_VALUE} instead of wrapping.
 */
class ClientCountersTest {
  private static final long MIB = 1 << 20;
  private static final long MAX = Long.MAX_VALUE;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;

  @BeforeEach
  void start() {
    backend = new HostShmBackend(dir.resolve("shm"), 2, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool0 = new DevicePool(backend.devices().get(0), backend, new PoolSettings(64 * MIB, 64 * MIB, 20 * MIB),
        sessions, DevicePools.segmentIdBase(0), ticker);
    DevicePool pool1 = new DevicePool(backend.devices().get(1), backend, new PoolSettings(64 * MIB, 64 * MIB, 20 * MIB),
        sessions, DevicePools.segmentIdBase(1), ticker);
    pools = new DevicePools(List.of(pool0, pool1));
    registry = new SessionRegistry(pools, backend, new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of()),
        ticker, sessions);
  }

  @AfterEach
  void close() {
    pools.all().forEach(DevicePool::verifyInvariants);
    pools.close();
    backend.close();
  }

  private long pool(int device, PoolMetric metric) {
    return pools.get(device).stats().get(metric);
  }

  @Test
  void twoSessionsReportingLongMax_poolFiguresSaturate_neverWrapNegative() {
    Session a = registry.open(Caller.DAEMON, "a", 0, -1);
    Session b = registry.open(Caller.DAEMON, "b", 0, -1);
    registry.clientCache().clientCounters(a, 0, MAX, MAX);
    registry.clientCache().clientCounters(b, 0, MAX, MAX);
    // Before issue 22: MAX + MAX wrapped to -2, which GetStats showed every tenant and which
    // made every /metrics scrape fail.
    assertEquals(MAX, pool(0, PoolMetric.CLIENT_CACHE_HITS));
    assertEquals(MAX, pool(0, PoolMetric.CLIENT_CACHE_RETURNS));

    Session c = registry.open(Caller.DAEMON, "c", 0, -1);
    registry.clientCache().clientCounters(c, 0, 5, 7);
    assertEquals(MAX, pool(0, PoolMetric.CLIENT_CACHE_HITS), "stays saturated");
    assertEquals(0, pool(1, PoolMetric.CLIENT_CACHE_HITS), "the other device is untouched");
  }

  @Test
  void oneSessionAtLongMaxOnTwoDevices_itsOwnSumSaturates() {
    Session s = registry.open(Caller.DAEMON, "s", 0, -1);
    registry.clientCache().clientCounters(s, 0, MAX, 3);
    registry.clientCache().clientCounters(s, 1, MAX, 4);
    assertArrayEquals(new long[] {MAX, 7}, s.clientCounters(), "ListSessions' sum over devices");
    assertEquals(MAX, pool(0, PoolMetric.CLIENT_CACHE_HITS));
    assertEquals(MAX, pool(1, PoolMetric.CLIENT_CACHE_HITS));
  }

  @Test
  void negativeValue_isIgnored_withOneDebugLine_andTheOtherCounterStillCounts() {
    Session s = registry.open(Caller.DAEMON, "confused", 0, -1);
    registry.clientCache().clientCounters(s, 0, 5, 2);
    try (LogCapture log = LogCapture.withDebug(ClientCache.class)) {
      // Long.MIN_VALUE - 5 wrapped to a huge positive delta before issue 22.
      registry.clientCache().clientCounters(s, 0, Long.MIN_VALUE, 3);
      registry.clientCache().clientCounters(s, 0, -1, -1);
      List<String> lines = log.messages("DEBUG").stream().filter(m -> m.contains("negative")).toList();
      assertEquals(2, lines.size(), "one line per report with a negative value: " + lines);
      assertTrue(lines.get(0).contains(s.toString()) && lines.get(0).contains("hits=" + Long.MIN_VALUE), lines.get(0));
    }
    assertEquals(5, pool(0, PoolMetric.CLIENT_CACHE_HITS), "the negative value added nothing");
    assertEquals(3, pool(0, PoolMetric.CLIENT_CACHE_RETURNS), "the valid value in the same report counted");
    assertArrayEquals(new long[] {5, 3}, s.clientCounters(), "the session kept its last valid values");

    // The session's cumulative values were not reset by the bad reports: only what is new counts.
    registry.clientCache().clientCounters(s, 0, 6, 3);
    assertEquals(6, pool(0, PoolMetric.CLIENT_CACHE_HITS));
  }

  @Test
  void cumulativeCounters_addOnlyWhatIsNew_andNothingWhenTheyGoBackwards() {
    Session s = registry.open(Caller.DAEMON, "s", 0, -1);
    registry.clientCache().clientCounters(s, 0, MAX - 1, 10);
    registry.clientCache().clientCounters(s, 0, 3, 4); // backwards: a confused client adds nothing
    registry.clientCache().clientCounters(s, 0, MAX, 10);
    assertEquals(MAX, pool(0, PoolMetric.CLIENT_CACHE_HITS));
    assertEquals(10, pool(0, PoolMetric.CLIENT_CACHE_RETURNS));
    assertArrayEquals(new long[] {MAX, 10}, s.clientCounters());
  }
}
