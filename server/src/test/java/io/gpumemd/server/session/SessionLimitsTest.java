package io.gpumemd.server.session;

import io.gpumemd.server.books.Quota;
import io.gpumemd.server.sharing.SharingSettings;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Session bounds (in all, per tenant, opens per second per tenant) and the churn log, on the
 * registry with a fake clock: the open rate's token bucket refills only when the test moves
 * time, and the minute summary comes when the test says a minute passed.
 */
class SessionLimitsTest {
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller BOB = new Caller("uid:1001", "uid 1001 pid 21", false, 1001, 1001, 21, "pid 21");
  private static final Caller ROOT = new Caller("uid:0", "uid 0 pid 1", true, 0, 0, 1, "pid 1");

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;

  private void start(SessionLimits limits) {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64L << 20, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(64L << 20, 64L << 20, 20L << 20), sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of(),
        0, Quota.UNLIMITED, false, limits, SharingSettings.DEFAULTS), ticker, sessions);
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
  void maxSessions_refusesEveryTenantAdminsIncluded_andFreesAsSessionsEnd() {
    start(new SessionLimits(3, 0, 0));
    Session a = registry.open(ALICE, "a", 0, 0);
    registry.open(ALICE, "a", 0, 0);
    registry.open(BOB, "b", 0, 0);
    for (Caller caller : List.of(ALICE, BOB, ROOT, Caller.DAEMON)) {
      ExhaustedException e = assertThrows(ExhaustedException.class, () -> registry.open(caller, "x", 0, 0));
      assertTrue(e.getMessage().contains("3 live sessions over all tenants (flag --max-sessions)"), e.getMessage());
    }
    assertEquals(3, registry.sessionCount(), "refusals open nothing");
    registry.close(ROOT, a.id()); // an admin needs no session to make room
    registry.open(ROOT, "admin", 0, 0);
    assertThrows(ExhaustedException.class, () -> registry.open(BOB, "b", 0, 0));
  }

  @Test
  void maxSessionsPerTenant_boundsOneTenant_notTheOthers() {
    start(new SessionLimits(0, 2, 0));
    Session first = registry.open(ALICE, "a", 0, 0);
    registry.open(ALICE, "a", 0, 0);
    ExhaustedException e = assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    assertTrue(e.getMessage().contains("session limit of tenant uid:1000 reached: 2 live sessions "
        + "(flag --max-sessions-per-tenant)"), e.getMessage());
    registry.open(BOB, "b", 0, 0);
    registry.open(BOB, "b", 0, 0);
    // An ended session gives its place back.
    registry.close(ALICE, first.id());
    registry.open(ALICE, "a", 0, 0);
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    assertEquals(4, registry.sessionCount());
  }

  @Test
  void maxSessions_refusalByTheTotal_keepsNoPlaceOfTheTenant() {
    start(new SessionLimits(2, 2, 0));
    registry.open(BOB, "b", 0, 0);
    registry.open(BOB, "b", 0, 0);
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    for (Session s : registry.sessions(Caller.DAEMON)) {
      registry.close(Caller.DAEMON, s.id());
    }
    registry.open(ALICE, "a", 0, 0);
    registry.open(ALICE, "a", 0, 0); // two refusals above must not have used up Alice's two places
  }

  @Test
  void openRate_burstThenOnePerTick_perTenant_withoutSleeping() {
    start(new SessionLimits(0, 0, 10));
    List<Session> opened = new ArrayList<>();
    for (int i = 0; i < 10; i++) {
      opened.add(registry.open(ALICE, "a", 0, 0)); // the burst: as many as the rate
    }
    ExhaustedException e = assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    assertTrue(e.getMessage().contains("session open rate of tenant uid:1000 exceeded: at most 10 opens per second "
        + "(flag --session-open-rate); retry in 100 ms"), e.getMessage());
    registry.open(BOB, "b", 0, 0); // another tenant has its own bucket
    ticker.advance(50, TimeUnit.MILLISECONDS);
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0), "half a token");
    ticker.advance(50, TimeUnit.MILLISECONDS);
    registry.open(ALICE, "a", 0, 0);
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    // Closing sessions does not give tokens back: the rate bounds opens, not live sessions.
    opened.forEach(s -> registry.close(ALICE, s.id()));
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    // A long pause refills the bucket to the burst, no more.
    ticker.advance(1, TimeUnit.HOURS);
    for (int i = 0; i < 10; i++) {
      registry.open(ALICE, "a", 0, 0);
    }
    assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "a", 0, 0));
    // The daemon's own caller is no peer: no rate.
    for (int i = 0; i < 50; i++) {
      registry.open(Caller.DAEMON, "in-process", 0, 0);
    }
  }

  @Test
  void admins_areBoundByTheirTenantsLimitsToo() {
    start(new SessionLimits(0, 1, 0));
    registry.open(ROOT, "admin", 0, 0);
    assertThrows(ExhaustedException.class, () -> registry.open(ROOT, "admin", 0, 0));
  }

  @Test
  void churn_opensAndEndsAreDebug_oneInfoLineAMinute_onlyWhenSomethingHappened() {
    start(new SessionLimits(0, 0, 5));
    try (LogCapture log = LogCapture.withDebug(SessionRegistry.class)) {
      List<Session> sessions = new ArrayList<>();
      for (int i = 0; i < 5; i++) {
        sessions.add(registry.open(ALICE, "w", 0, 0));
      }
      for (int i = 0; i < 3; i++) {
        assertThrows(ExhaustedException.class, () -> registry.open(ALICE, "w", 0, 0));
      }
      for (Session s : sessions) {
        registry.close(ALICE, s.id());
      }
      assertEquals(10, log.messages("DEBUG").size(), log.messages("DEBUG").toString());
      registry.reap();
      assertEquals(List.of(), log.messages("INFO"), "not before the minute is over");
      ticker.advance(60, TimeUnit.SECONDS);
      registry.reap();
      assertEquals(List.of("Sessions in the last 60 s: 5 opened, 5 ended; refused: 3 by --session-open-rate, "
          + "0 by --max-sessions-per-tenant, 0 by --max-sessions; 0 live"), log.messages("INFO"));
      ticker.advance(10, TimeUnit.MINUTES);
      registry.reap();
      assertEquals(1, log.messages("INFO").size(), "a quiet minute says nothing");
    }
  }

  @Test
  void churn_sessionsEndingWithMemory_fiveInfoLinesAMinute_theRestSummedUp() {
    start(SessionLimits.UNLIMITED);
    try (LogCapture log = new LogCapture(SessionRegistry.class)) {
      for (int i = 0; i < 20; i++) {
        Session s = registry.open(ALICE, "holder-" + i, 0, 0);
        registry.lease(ALICE, s.id(), 0, 4096, false, "", false);
        registry.close(ALICE, s.id());
      }
      List<String> info = log.messages("INFO");
      assertEquals(SessionChurn.HOLDING_LINES_PER_WINDOW, info.size(), info.toString());
      assertTrue(info.get(0).contains("('holder-0') ended: closed by the client; released 1 leases"), info.get(0));
      ticker.advance(61, TimeUnit.SECONDS);
      registry.reap();
      String summary = log.messages("INFO").get(SessionChurn.HOLDING_LINES_PER_WINDOW);
      assertEquals("Sessions in the last 61 s: 20 opened, 20 ended (20 holding memory: 20 leases, 80.0 KiB returned; "
          + "15 of them logged at DEBUG only); 0 live", summary);
      // A new minute: single lines again.
      Session s = registry.open(ALICE, "again", 0, 0);
      registry.lease(ALICE, s.id(), 0, 4096, false, "", false);
      registry.close(ALICE, s.id());
      assertEquals(SessionChurn.HOLDING_LINES_PER_WINDOW + 2, log.messages("INFO").size());
    }
  }
}
