package io.gpumemd.server.sharing;

import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.LeaseRecord;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.RecordingChannel;
import io.gpumemd.server.testing.FakeTicker;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code --max-holds-per-tenant}: the holds all sessions of one tenant take by Attach and
 * Lookup are bounded together, a refusal names the tenant, the bound and the flag and changes
 * nothing, another tenant and the daemon's own caller go on, and every way a hold ends gives
 * its place back. Real host-backend pools, a fake clock, the pool's books checked after each
 * case.
 */
class HoldsPerTenantTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000", false, 1000, 1000, 11, "pid 11");
  private static final Caller ALICE2 = new Caller("uid:1000", "uid 1000", false, 1000, 1000, 12, "pid 12");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000", false, 2000, 2000, 21, "pid 21");
  private static final Caller ROOT = new Caller("uid:0", "uid 0", true, 0, 0, 1, "pid 1");
  private static final byte[] NO_EVENT = new byte[0];

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private SharedObjects sharing;

  private void start(int holdsPerSession, int holdsPerTenant) {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(64 * MIB, 64 * MIB, 20 * MIB, 0, 64 * MIB), sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    SharingSettings bounds = new SharingSettings(300, 3600, holdsPerSession, 4096, holdsPerTenant);
    registry = new SessionRegistry(pools, backend, SessionSettings.defaults().withSharing(bounds), ticker, sessions);
    sharing = registry.sharing();
  }

  @AfterEach
  void verifyAndClose() {
    if (pools != null) {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  private Session open(Caller caller, String name) {
    return registry.open(caller, name, 30, 0);
  }

  /** A lease of {@code caller}'s, shared by a token of any number of attaches. */
  private String token(Caller caller) {
    Session owner = open(caller, "owner");
    LeaseRecord lease = registry.lease(caller, owner.id(), 0, 4096, false, "t", false);
    return sharing.share(caller, owner.id(), lease.id(), 0, false, 0).token();
  }

  private int tenantHolds(Caller caller) {
    return registry.tenant(caller.tenant()).holds();
  }

  private long stat(PoolMetric metric) {
    return pools.get(0).stats().get(metric);
  }

  @Test
  void atTheTenantBound_attachAndLookupAreRefused_namingTenantBoundAndFlag_andNothingChanges() {
    start(2, 3);
    String token = token(ALICE);
    Session r1 = open(ALICE2, "r1");
    Session r2 = open(ALICE2, "r2");
    sharing.attach(ALICE2, r1.id(), token, "");
    sharing.attach(ALICE2, r1.id(), token, "");
    LeaseRecord third = sharing.attach(ALICE2, r2.id(), token, "");
    sharing.publish(ALICE, r2.id(), third.id(), "kv", false);
    assertEquals(3, tenantHolds(ALICE));
    String before = books(r2, third);

    ExhaustedException byToken = assertThrows(ExhaustedException.class, () -> sharing.attach(ALICE2, r2.id(), token, ""));
    assertTrue(byToken.getMessage().contains("tenant uid:1000 has 3 holds on shared blocks over all its sessions, the "
        + "bound of 3 (flag --max-holds-per-tenant)"), byToken.getMessage());
    ExhaustedException byName = assertThrows(ExhaustedException.class, () -> sharing.lookup(ALICE2, r2.id(), "kv", ""));
    assertTrue(byName.getMessage().contains("--max-holds-per-tenant"), byName.getMessage());
    assertEquals(before, books(r2, third), "the refusals changed nothing");
    // nor did they keep r2's places: with one of the tenant's holds gone, r2 takes its second,
    // up to its session bound
    registry.close(ALICE2, r1.id());
    sharing.attach(ALICE2, r2.id(), token, "");
    ExhaustedException perSession = assertThrows(ExhaustedException.class,
        () -> sharing.attach(ALICE2, r2.id(), token, ""));
    assertTrue(perSession.getMessage().contains("--max-holds-per-session"), perSession.getMessage());
    assertEquals(2, tenantHolds(ALICE));

    // Another tenant is not held back by this one's holds.
    String bobs = token(BOB);
    Session bob = open(BOB, "bob");
    sharing.attach(BOB, bob.id(), bobs, "");
    sharing.attach(BOB, bob.id(), bobs, "");
    assertEquals(2, tenantHolds(BOB));
    assertEquals(2, tenantHolds(ALICE));

    // The daemon's own caller is no peer: the session bound holds it, the tenant bound does not
    // (the convention of SessionLimits); its holds still count, and go back like any other.
    Session r3 = open(ALICE2, "r3");
    sharing.attach(ALICE2, r3.id(), token, "");
    assertThrows(ExhaustedException.class, () -> sharing.attach(ALICE2, r3.id(), token, ""));
    LeaseRecord own = sharing.attach(Caller.DAEMON, r3.id(), token, "");
    assertEquals(4, tenantHolds(ALICE));
    registry.release(Caller.DAEMON, r3.id(), own.id(), NO_EVENT);
    assertEquals(3, tenantHolds(ALICE));
  }

  /** What a refused hold must leave as it was. */
  private String books(Session session, LeaseRecord hold) {
    return List.of(stat(PoolMetric.LIVE_HOLDS), stat(PoolMetric.ATTACHES), (long) registry.liveLeases(),
        (long) hold.shared().holds(), session.holdings()[3], (long) tenantHolds(ALICE)).toString();
  }

  @Test
  void everyWayAHoldEnds_givesItsPlaceAmongTheTenantsHoldsBack() {
    start(0, 2);
    String token = token(ALICE);
    Session publisher = open(ALICE, "publisher");
    LeaseRecord named = registry.lease(ALICE, publisher.id(), 0, 4096, false, "n", false);
    sharing.publish(ALICE, publisher.id(), named.id(), "weights", true);

    // Release, of a hold by token and of a hold by name
    Session s = open(ALICE2, "release");
    LeaseRecord byToken = sharing.attach(ALICE2, s.id(), token, "");
    LeaseRecord byName = sharing.lookup(ALICE2, s.id(), "weights", "");
    assertAtBound(s, token);
    registry.release(ALICE2, s.id(), byToken.id(), NO_EVENT);
    registry.release(ALICE2, s.id(), byName.id(), NO_EVENT);
    assertEquals(0, tenantHolds(ALICE));

    // CloseSession by the client
    fill(s, token);
    registry.close(ALICE2, s.id());
    assertEquals(0, tenantHolds(ALICE), "close");

    // an admin of another tenant ends the session
    Session ended = open(ALICE2, "ended-by-admin");
    fill(ended, token);
    registry.close(ROOT, ended.id());
    assertEquals(0, tenantHolds(ALICE), "admin close");

    // TTL expiry without keep-alive
    Session expiring = open(ALICE2, "expiring");
    fill(expiring, token);
    ticker.advance(31, TimeUnit.SECONDS);
    registry.reap();
    assertEquals(0, tenantHolds(ALICE), "ttl");

    // the KeepAlive stream gone past the grace period
    Session streamed = open(ALICE2, "streamed");
    RecordingChannel channel = new RecordingChannel();
    registry.attach(ALICE2, streamed.id(), channel);
    fill(streamed, token);
    registry.detach(streamed, channel);
    ticker.advance(registry.settings().graceMillis() + 1, TimeUnit.MILLISECONDS);
    registry.reap();
    assertEquals(0, tenantHolds(ALICE), "stream gone");

    // a one-shot token: its own hold passes to the attaching session's, which counts once
    Session oneShot = open(ALICE, "one-shot-owner");
    LeaseRecord lease = registry.lease(ALICE, oneShot.id(), 0, 4096, false, "o", false);
    String once = sharing.share(ALICE, oneShot.id(), lease.id(), 0, false, 1).token();
    Session taker = open(ALICE2, "taker");
    LeaseRecord taken = sharing.attach(ALICE2, taker.id(), once, "");
    assertEquals(1, tenantHolds(ALICE));
    registry.release(ALICE2, taker.id(), taken.id(), NO_EVENT);
    assertEquals(0, tenantHolds(ALICE), "one-shot");

    // the daemon shutting down
    Session last = open(ALICE2, "last");
    fill(last, token);
    registry.endAll("test over");
    assertEquals(0, tenantHolds(ALICE), "shutdown");
    assertEquals(0, stat(PoolMetric.LIVE_HOLDS));
    assertEquals(0, stat(PoolMetric.LEASED_BYTES), "every block went back with its last hold");
  }

  /** Takes the tenant's two holds in {@code s}, then checks that a third is refused. */
  private void fill(Session s, String token) {
    assertEquals(0, tenantHolds(ALICE), "every earlier hold gave its place back");
    sharing.attach(ALICE2, s.id(), token, "");
    sharing.lookup(ALICE2, s.id(), "weights", "");
    assertAtBound(s, token);
  }

  private void assertAtBound(Session s, String token) {
    assertEquals(2, tenantHolds(ALICE));
    assertThrows(ExhaustedException.class, () -> sharing.attach(ALICE2, s.id(), token, ""));
    assertEquals(2, tenantHolds(ALICE), "the refusal took nothing");
  }
}
