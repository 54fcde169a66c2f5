package io.gpumemd.server.session;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.common.Ticker;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.InMemoryBackend;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.testing.FakeTicker;
import java.util.List;
import org.junit.jupiter.api.Test;

/** A session that ends while one of its leases is inside the pool gives everything back. */
class SessionEndRaceTest {
  @Test
  void sessionClosedDuringABackendAllocation_leavesNoMapperBehind() {
    InMemoryBackend backend = new InMemoryBackend(64L << 20);
    LiveSessions sessions = new LiveSessions();
    FakeTicker ticker = new FakeTicker();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(64L << 20, 64L << 20, 20L << 20),
        sessions, DevicePools.segmentIdBase(0), ticker);
    DevicePools pools = new DevicePools(List.of(pool));
    SessionRegistry registry = new SessionRegistry(pools, backend, SessionSettings.defaults(), ticker, sessions);
    Session session = registry.open(Caller.DAEMON, "racer", 0, -1);
    backend.onAllocate(() -> registry.close(Caller.DAEMON, session.id())); // the session ends mid-lease

    assertThrows(NotFoundException.class, () -> registry.lease(Caller.DAEMON, session.id(), 0, 4096, false, "", false));
    assertEquals(0, registry.liveLeases());
    assertEquals(0, pool.mappedSegments(session.id()));
    assertEquals(2L << 20, pool.trim(0));
    assertEquals(0, pool.stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "freed at once: nobody maps it");
    assertEquals(0, backend.liveSegments());
    pool.verifyInvariants();
    pools.close();
  }
}
