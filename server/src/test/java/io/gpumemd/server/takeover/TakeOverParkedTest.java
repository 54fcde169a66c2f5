package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A take-over while a published object is parked is refused, naming the object (its contents are
 * in this process's host memory), and goes ahead once it is restored.
 */
class TakeOverParkedTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private HostShmBackend backend;
  private DevicePools pools;

  @AfterEach
  void close() {
    pools.close();
    backend.close();
  }

  @Test
  void export_whileAnObjectIsParked_isRefusedNamingIt_andNotOnceItIsLookedUp() {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    pools = new DevicePools(List.of(new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(32 * MIB, 32 * MIB, 20 * MIB, 50), sessions, DevicePools.segmentIdBase(0), Ticker.system())));
    SessionRegistry registry = new SessionRegistry(pools, backend,
        new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of()), Ticker.system(), sessions, 64 * MIB);
    Session loader = registry.open(Caller.DAEMON, "loader", 0, -1);
    LeaseRecord lease = registry.lease(Caller.DAEMON, loader.id(), 0, MIB, false, "", false);
    registry.sharing().publish(Caller.DAEMON, loader.id(), lease.id(), "weights", true);
    registry.release(Caller.DAEMON, loader.id(), lease.id(), new byte[0]);
    registry.sharing().park(Caller.DAEMON, "", "weights");

    TakeOverRefusedException refused = assertThrows(TakeOverRefusedException.class,
        () -> TakeOverState.write(pools, registry, new OutgoingDescriptors(List.of())));

    assertTrue(refused.getMessage().contains("'weights'"), refused.getMessage());
    assertTrue(refused.getMessage().contains("parked"), refused.getMessage());
    registry.sharing().lookup(Caller.DAEMON, loader.id(), "weights", "");
    assertNull(TakeOverState.parkedRefusal(registry));
  }
}
