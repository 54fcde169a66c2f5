package io.gpumemd.it.hardening;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.it.e2e.DeviceBooks;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.RemoveShareRequest;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestChannel;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.URLDecoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Soak: every attack of issues 15 and 22 at once against one daemon in its own JVM (-Xmx256m)
 * for 40 s by default ({@code -Dgpumemd.soak.seconds=N} sets it), each attacker a process of its own
 * under another uid: the three reply floods that never read their streams and client counters
 * of Long.MAX_VALUE from two sessions ({@link KeepAliveFloodMain}); cache notices far beyond a
 * 4 KiB allowance, holds up to the bounds (lowered here to {@value #SESSION_HOLDS} a session and
 * {@value #TENANT_HOLDS} a tenant), share tokens of the longest life, 3,000 idle TCP
 * connections and 40 half-sent metrics requests ({@link AbuseAttackMain}), all as uid 65534;
 * and a session flood from 8 threads as uid 65533 (a tenant of its own: the open rate is per
 * tenant, and in 65534's tenant it would leave the other attacks hardly a session to work with).
 *
 * <p>Beside them, this JVM (uid 0) leases through the client library checking its bytes, probes
 * 1 s-TTL sessions, checks health every 20 ms and, every 500 ms, the books ({@link
 * BooksMonitor}). Afterwards: the daemon alive and serving, every attack defended as its
 * attacker saw it, and once every client has gone, the attacker's tokens revoked and a trim,
 * nothing left: no session, no lease, no hold, no byte reserved. Then SIGTERM exits 0.
 */
class AbuseSoakTest {
  private static final long SECONDS = Long.getLong("gpumemd.soak.seconds", 40);
  private static final long STALL_MS = ReplyFloodTest.STALL_MS;
  private static final long GRACE_MS = ReplyFloodTest.GRACE_MS;
  /** Sessions without a stream end within this (the flood's sessions, the attackers' unary ones). */
  private static final int MAX_TTL_SECONDS = 5;
  /**
   * Holds per session and per tenant: low, so that the holds attacker, slowed by the others to
   * a few hundred attaches a second on a 2-core machine, reaches both within the soak.
   */
  private static final long SESSION_HOLDS = 800;
  private static final long TENANT_HOLDS = 2000;
  private static final int FLOOD_UID = 65533;
  private static final double HEALTH_P99_MS = 1000;
  /**
   * The longest single check: below the checks' 5 s deadline, so that a daemon that stops
   * answering for seconds fails here and not only as a missed deadline. Not tighter: one
   * clean-clone run on the shared 2-core machine (2026-11-27) saw one check of 1,125 take 3,977
   * ms with the p50 at 7 ms and the p99 at 115, a stall of the machine that the p99 bound,
   * which catches a starved daemon, did not see.
   */
  private static final double HEALTH_MAX_MS = 4500;
  private static final long RSS_MIB = 512;
  /**
   * The median time a 1 s-TTL session takes to end after its last call: a healthy reaper (every
   * 100 ms) ends it in about 1.1 s, and one that the attacks slow down or starve shows here.
   */
  private static final long TTL_EXPIRY_P50_MS = 2000;
  /**
   * The longest: the TTL plus one stall of the machine of the size {@link #HEALTH_MAX_MS} allows.
   * Not tighter: one clean-clone run on the shared 2-core machine (2026-11-28) saw one of 23
   * sessions end after 3,732 ms with the others at 1.0 to 2.3 s. A dead reaper never ends one,
   * which {@link TtlProbe} records as a failure after 10 s.
   */
  private static final long TTL_EXPIRY_MAX_MS = 1000 + (long) HEALTH_MAX_MS;

  @BeforeAll
  static void needRoot() {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run the attackers as other uids");
  }

  @Test
  void everyAttackAtOnce_othersServed_booksBalanced_nothingLeft() throws Exception {
    assertTrue(SECONDS >= 10, "gpumemd.soak.seconds: at least 10, not " + SECONDS);
    int metricsPort;
    try (ServerSocket free = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      metricsPort = free.getLocalPort();
    }
    Map<String, AttackerProcess> attackers = new LinkedHashMap<>();
    try (DaemonProcess daemon = ReplyFloodTest.startDaemon("--metrics-host", "127.0.0.1", "--metrics-port",
        Integer.toString(metricsPort), "--session-ttl-seconds", "2", "--max-session-ttl-seconds",
        Integer.toString(MAX_TTL_SECONDS), "--max-holds-per-session", Long.toString(SESSION_HOLDS), "--max-holds-per-tenant",
        Long.toString(TENANT_HOLDS));
         TestChannel probe = new TestChannel(daemon.unixTarget());
         HealthMonitor health = new HealthMonitor(probe.channel(), daemon.process().pid())) {
      Thread.sleep(2000); // both JVMs compile the health path first
      health.reset();
      long t0 = System.nanoTime();
      String seconds = Long.toString(SECONDS);
      for (String mode : List.of("release", "notice", "lease")) {
        attackers.put(mode, AttackerProcess.start(KeepAliveFloodMain.class, daemon.unixTarget(), mode, seconds,
            Long.toString(STALL_MS + 3000)));
      }
      attackers.put("counters", AttackerProcess.start(KeepAliveFloodMain.class, daemon.unixTarget(), "counters",
          seconds, "0"));
      for (String mode : List.of("allowance", "holds", "tokens")) {
        attackers.put(mode, AttackerProcess.start(AbuseAttackMain.class, mode, daemon.unixTarget(), seconds));
      }
      attackers.put("idle-tcp", AttackerProcess.start(AbuseAttackMain.class, "idle-tcp", daemon.tcpTarget(), seconds));
      attackers.put("slowloris", AttackerProcess.start(AbuseAttackMain.class, "slowloris",
          Integer.toString(metricsPort), seconds));
      attackers.put("sessions", AttackerProcess.start(FLOOD_UID, AbuseAttackMain.class, "sessions",
          daemon.unixTarget(), seconds));

      Map<String, Map<String, String>> results = new LinkedHashMap<>();
      HealthMonitor.Figures figures;
      try (Bystander bystander = new Bystander(daemon.unixTarget(), "bystander");
           TtlProbe ttl = new TtlProbe(probe.channel());
           BooksMonitor books = new BooksMonitor(probe.channel(), metricsPort, TENANT_HOLDS)) {
        for (Map.Entry<String, AttackerProcess> a : attackers.entrySet()) {
          results.put(a.getKey(), a.getValue().result(SECONDS + 60));
        }
        figures = health.figures();
        books.close();
        ttl.close();
        bystander.close();
        System.out.printf("abuse soak, %d s, %d attackers, %.1f s in all: %s; bystander %s; 1 s-TTL sessions ended "
            + "after %s ms (%d served only past their TTL); books checked %d times, /metrics %d times, most live holds %d%n",
            SECONDS, attackers.size(), (System.nanoTime() - t0) / 1e9, figures, bystander, ttl.expiryMillis(), ttl.late(),
            books.polls(),
            books.scrapes(), books.mostHolds());
        results.forEach((k, r) -> System.out.println(k + ": " + resultLine(r)));
        books.failures().forEach(f -> System.out.println("books: " + f));

        assertTrue(daemon.process().isAlive(), "the daemon died:\n" + ReplyFloodTest.tail(daemon.output()));
        assertEquals(0, figures.failures(), "health checks failed or missed their deadline: " + figures);
        assertTrue(figures.p99Ms() < HEALTH_P99_MS, "health p99: " + figures);
        assertTrue(figures.maxMs() < HEALTH_MAX_MS, "health max: " + figures);
        assertTrue(figures.maxRssMib() < RSS_MIB, "daemon RSS: " + figures);
        assertEquals(0, bystander.failures(), "another tenant's leases: " + bystander);
        assertEquals(0, bystander.corruptions(), "another tenant's bytes: " + bystander);
        assertTrue(bystander.ops() >= 50, "another tenant's leases: " + bystander);
        assertEquals(List.of(), ttl.failures(), "1 s-TTL sessions");
        List<Long> expiry = ttl.expiryMillis().stream().sorted().toList();
        assertTrue(expiry.size() >= 3, "1 s-TTL sessions probed: " + expiry);
        assertTrue(expiry.get(expiry.size() / 2) < TTL_EXPIRY_P50_MS && expiry.get(expiry.size() - 1) < TTL_EXPIRY_MAX_MS,
            "1 s-TTL sessions ended after " + ttl.expiryMillis() + " ms");
        assertTrue(books.polls() >= 5, "books checked " + books.polls() + " times");
        assertTrue(books.scrapes() >= 2, "/metrics scraped " + books.scrapes() + " times");
        assertEquals(List.of(), books.failures(), "the books, the allowances, /metrics during the attack");
      }
      assertAttacksDefended(results);

      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(probe.channel());
      assertNothingLeft(admin, results);
      assertEquals(HealthCheckResponse.ServingStatus.SERVING, HealthGrpc.newBlockingStub(probe.channel())
          .withDeadlineAfter(5, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance()).getStatus());
      HttpResponse<String> scrape = HttpClient.newHttpClient().send(HttpRequest.newBuilder(
          URI.create("http://127.0.0.1:" + metricsPort + "/metrics")).timeout(java.time.Duration.ofSeconds(10)).build(),
          HttpResponse.BodyHandlers.ofString());
      assertEquals(200, scrape.statusCode());
      assertTrue(scrape.body().contains("# TYPE gpumemd_"), "/metrics after the attacks: " + scrape.body().length()
          + " characters");
      assertEquals(0, daemon.terminate(20_000), ReplyFloodTest.tail(daemon.output()));
    } finally {
      attackers.values().forEach(AttackerProcess::close);
    }
  }

  /** What each attacker got shows its attack was made and refused. */
  private static void assertAttacksDefended(Map<String, Map<String, String>> results) {
    for (String mode : List.of("release", "notice", "lease")) {
      Map<String, String> r = results.get(mode);
      String out = mode + ": " + r.get("output");
      assertEquals("0", r.get("readBeforeAsked"), out);
      List<String> statuses = Arrays.asList(r.get("statuses").split(","));
      assertTrue(statuses.contains("RESOURCE_EXHAUSTED"), "at least one flooding stream cut off: " + out);
      // NONE: a round that found no session to flood (the tenant's open rate); never one left open.
      assertTrue(statuses.stream().allMatch(s -> s.equals("RESOURCE_EXHAUSTED") || s.equals("NONE")),
          "every flooding stream is cut off: " + out);
    }
    Map<String, String> counters = results.get("counters");
    assertEquals("2", counters.get("rounds"), counters.get("output"));
    assertTrue(Long.parseLong(counters.get("sent")) >= 100, counters.get("output"));

    Map<String, String> allowance = results.get("allowance");
    assertEquals("4096", allowance.get("allowance"), allowance.get("output"));
    assertEquals("0", allowance.get("mostClientCached"), "1 MiB blocks never fit a 4 KiB allowance: "
        + allowance.get("output"));
    assertTrue(Long.parseLong(allowance.get("noticesRefused")) > 0, allowance.get("output"));
    assertTrue(outcome(allowance, "lease:OK") == 8, allowance.get("output"));

    Map<String, String> holds = results.get("holds");
    assertTrue(Long.parseLong(holds.get("holds")) > SESSION_HOLDS, "held over several sessions: " + holds.get("output"));
    assertTrue(outcome(holds, "attach:RESOURCE_EXHAUSTED") > 0, holds.get("output"));
    assertTrue(Long.parseLong(holds.get("holds")) <= TENANT_HOLDS, "the tenant's hold bound: " + holds.get("output"));
    if (SECONDS >= 60) {
      // Reached at about a hundred attaches a second; shorter runs may end before.
      assertTrue(!holds.get("refusedOnFreshSession").equals("0"), "the tenant's bound reached: " + holds.get("output"));
    }
    if (!holds.get("refusedOnFreshSession").equals("0")) {
      String why = URLDecoder.decode(holds.get("freshRefusal"), StandardCharsets.UTF_8);
      assertTrue(why.contains("--max-holds-per-tenant"), "a fresh session refused names the tenant's bound: " + why);
    }

    // Not refused (up to --max-shares-per-tenant, which it stays under): what ends them is an admin.
    Map<String, String> tokens = results.get("tokens");
    assertTrue(Long.parseLong(tokens.get("tokens")) > 0, tokens.get("output"));
    assertEquals("86400", tokens.get("longestSeconds"), tokens.get("output"));

    Map<String, String> flood = results.get("sessions");
    assertTrue(outcome(flood, "OK") > 0 && outcome(flood, "RESOURCE_EXHAUSTED") > 0,
        "the open rate held the session flood: " + flood.get("output"));
    Map<String, String> idle = results.get("idle-tcp");
    assertTrue(Integer.parseInt(idle.get("keptOpen")) <= 1000, "--tcp-max-connections: " + idle.get("output"));
    Map<String, String> slow = results.get("slowloris");
    assertTrue(Integer.parseInt(slow.get("scrapesOk")) > 0, slow.get("output"));
    assertEquals("0", slow.get("scrapesFailed"), slow.get("output"));
  }

  /**
   * Once every client has gone (the attackers' streams past the grace period, sessions without
   * one past their TTL), the tokens revoked and a trim: no session, lease, hold or reserved byte.
   */
  private static void assertNothingLeft(AdminGrpc.AdminBlockingStub admin, Map<String, Map<String, String>> results)
      throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(MAX_TTL_SECONDS + 10);
    while (!AdminQueries.sessions(admin).isEmpty() && System.nanoTime() < deadline) {
      Thread.sleep(200);
    }
    assertEquals(List.of(), AdminQueries.sessions(admin).stream().map(s -> s.getTenant() + " '" + s.getClientName()
        + "' " + s.getSessionId()).toList(), "sessions left after every client has gone");
    // The attacker's tokens outlive it by a day: an admin ends them.
    List<ShareInfo> tokens = AdminQueries.shares(admin);
    assertEquals(results.get("tokens").get("tokens"), Integer.toString(tokens.size()), "the tokens attacker's, "
        + "and no other");
    for (ShareInfo token : tokens) {
      assertEquals("uid:" + OtherUser.NOBODY, token.getTenant());
      admin.withDeadlineAfter(10, TimeUnit.SECONDS).removeShare(RemoveShareRequest.newBuilder()
          .setTenant(token.getTenant()).setShareId(token.getShareId()).build());
    }
    assertEquals(List.of(), AdminQueries.shares(admin));
    admin.withDeadlineAfter(10, TimeUnit.SECONDS).trim(TrimRequest.newBuilder().setKeepBytes(0).build());
    for (DeviceStats d : admin.withDeadlineAfter(10, TimeUnit.SECONDS).getStats(GetStatsRequest.getDefaultInstance())
        .getDevicesList()) {
      DeviceBooks.assertBalanced(d);
      String where = "device " + d.getDevice() + ": " + d;
      assertEquals(0, d.getLeasedBytes(), where);
      assertEquals(0, d.getActiveLeases(), where);
      assertEquals(0, d.getLiveHolds(), where);
      assertEquals(0, d.getClientCachedBytes(), where);
      assertEquals(0, d.getReservedBytes(), where);
      assertTrue(d.getClientCacheHits() >= 0 && d.getClientCacheReturns() >= 0, where);
    }
  }

  private static long outcome(Map<String, String> result, String key) {
    for (String kv : result.get("outcomes").split(",")) {
      int at = kv.lastIndexOf(':');
      if (at > 0 && kv.substring(0, at).equals(key)) {
        return Long.parseLong(kv.substring(at + 1));
      }
    }
    return 0;
  }

  private static String resultLine(Map<String, String> r) {
    return r.get("output").lines().filter(l -> l.startsWith("RESULT")).findFirst().orElse("no RESULT");
  }
}
