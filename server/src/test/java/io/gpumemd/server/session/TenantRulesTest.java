package io.gpumemd.server.session;

import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.testing.FakeTicker;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The registry's tenant rules over real host-backend pools: ownership by tenant, the
 * per-tenant quota across sessions, listing scope, admin ending foreign sessions, and the
 * KeepAlive stream pinned to its origin.
 */
class TenantRulesTest {
  private static final long KIB = 1024;
  private static final Caller ALICE_1 = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller ALICE_2 = new Caller("uid:1000", "uid 1000 pid 12", false, 1000, 1000, 12, "pid 12");
  private static final Caller BOB = new Caller("uid:1001", "uid 1001 pid 21", false, 1001, 1001, 21, "pid 21");
  private static final Caller ROOT = new Caller("uid:0", "uid 0 pid 1", true, 0, 0, 1, "pid 1");

  @TempDir
  Path dir;

  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;

  private void start(Quota tenantQuota) {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64L << 20, null);
    LiveSessions sessions = new LiveSessions();
    FakeTicker ticker = new FakeTicker();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(64L << 20, 64L << 20, 20L << 20), sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, new SessionSettings(30, 3600, 2000, 0,
        new Quota(32 * KIB, 0), Map.of(), 0, tenantQuota, false), ticker, sessions);
  }

  @AfterEach
  void close() {
    if (pools != null) {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  @Test
  void tenantQuota_holdsAcrossManySessions_andFreesAsLeasesGoBack() {
    start(new Quota(64 * KIB, 0));
    List<LeaseRecord> held = new ArrayList<>();
    // Each session may hold 32 KiB; the tenant 64 KiB over all of them.
    for (int i = 0; i < 8; i++) {
      Session s = registry.open(ALICE_1, "worker-" + i, 0, 0);
      try {
        held.add(registry.lease(ALICE_1, s.id(), 0, 16 * KIB, false, "", false));
      } catch (ExhaustedException e) {
        assertTrue(e.getMessage().contains("tenant quota max-leased-bytes=65536"), e.getMessage());
        assertTrue(e.getMessage().contains("--tenant-max-leased-bytes"), e.getMessage());
      }
    }
    assertEquals(4, held.size(), "four 16 KiB leases fit the tenant's 64 KiB");
    // Another tenant is not affected by Alice's usage.
    Session bob = registry.open(BOB, "bob", 0, 0);
    assertNotNull(registry.lease(BOB, bob.id(), 0, 16 * KIB, false, "", false));
    // Alice's bytes come back when a lease is released, and when a session ends.
    registry.release(ALICE_1, held.get(0).session().id(), held.get(0).id(), new byte[0]);
    Session again = registry.open(ALICE_1, "again", 0, 0);
    assertNotNull(registry.lease(ALICE_1, again.id(), 0, 16 * KIB, false, "", false));
    ExhaustedException full = assertThrows(ExhaustedException.class,
        () -> registry.lease(ALICE_1, again.id(), 0, 4 * KIB, false, "", false));
    assertTrue(full.getMessage().contains("tenant quota"), full.getMessage());
    registry.close(ALICE_1, held.get(1).session().id());
    assertNotNull(registry.lease(ALICE_1, again.id(), 0, 4 * KIB, false, "", false));
  }

  @Test
  void anotherTenantsSession_isNotFound_exactlyLikeAnUnknownOne_butAnAdminMayEndIt() {
    start(Quota.UNLIMITED);
    Session alice = registry.open(ALICE_1, "alice", 0, 0);
    LeaseRecord lease = registry.lease(ALICE_1, alice.id(), 0, 4 * KIB, false, "", false);
    String unknown = "0".repeat(alice.id().length());
    NotFoundException foreign = assertThrows(NotFoundException.class, () -> registry.session(BOB, alice.id()));
    NotFoundException never = assertThrows(NotFoundException.class, () -> registry.session(BOB, unknown));
    assertEquals(never.getMessage().replace(unknown, "ID"), foreign.getMessage().replace(alice.id(), "ID"));
    assertThrows(NotFoundException.class, () -> registry.release(BOB, alice.id(), lease.id(), new byte[0]));
    assertThrows(NotFoundException.class, () -> registry.close(BOB, alice.id()));
    assertThrows(NotFoundException.class, () -> registry.lease(BOB, alice.id(), 0, 4 * KIB, false, "", false));
    assertEquals(List.of(), registry.sessions(BOB));
    assertEquals(List.of(), registry.leases(BOB, null, ""));
    assertEquals(List.of(), registry.leases(BOB, null, alice.id()));
    // Same tenant, another process: may see and use it.
    assertEquals(List.of(alice), registry.sessions(ALICE_2));
    assertEquals(1, registry.leases(ALICE_2, null, "").size());
    // An admin sees everything and may end it.
    assertEquals(1, registry.sessions(ROOT).size());
    assertEquals(4 * KIB, registry.close(ROOT, alice.id())[1]);
    assertEquals(0, registry.liveLeases());
  }

  @Test
  void keepAliveStream_isPinnedToItsOrigin() {
    start(Quota.UNLIMITED);
    Session alice = registry.open(ALICE_1, "alice", 0, 0);
    RecordingChannel first = new RecordingChannel();
    registry.attach(ALICE_1, alice.id(), first);
    RecordingChannel intruder = new RecordingChannel();
    ConflictException refused = assertThrows(ConflictException.class, () -> registry.attach(ALICE_2, alice.id(), intruder));
    assertTrue(refused.getMessage().contains("pid 11") && refused.getMessage().contains("pid 12"), refused.getMessage());
    assertThrows(NotFoundException.class, () -> registry.attach(BOB, alice.id(), intruder));
    assertEquals(first, alice.channel(), "the first stream stays");
    assertTrue(!first.closed);
    // The same process reconnecting replaces its own stream.
    RecordingChannel reconnect = new RecordingChannel();
    registry.attach(ALICE_1, alice.id(), reconnect);
    assertTrue(first.closed);
    assertEquals(reconnect, alice.channel());
    // Once the stream is gone, another process of the tenant may attach.
    registry.detach(alice, reconnect);
    registry.attach(ALICE_2, alice.id(), intruder);
    assertEquals(intruder, alice.channel());
  }
}
