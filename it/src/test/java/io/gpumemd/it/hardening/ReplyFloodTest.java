package io.gpumemd.it.hardening;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestChannel;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Issue 22's reply flood, with real processes: a daemon in its own JVM with a small heap
 * (-Xmx256m, {@code gpumemd.test.xmx}) and its socket open to every user; three attackers under
 * uid 65534 ({@link KeepAliveFloodMain}: empty releases, bogus cache notices, leases of size 0,
 * {@value KeepAliveFloodMain#ENTRIES} entries a message) that flood their KeepAlive streams and
 * never read them, for {@value #FLOOD_SECONDS} s. Meanwhile, from this JVM (uid 0, another
 * tenant): health over the Unix socket every 20 ms, leases by the client library with their
 * bytes checked, and 1 s-TTL sessions that must expire on time (the reaper still runs).
 *
 * <p>Bounds asserted, generous for a loaded 2-core CI machine and far below what the unbounded
 * queue did (RSS 181 to 3,716 MiB in 32 s on the default heap; with a small heap,
 * OutOfMemoryError and a dead reaper): health p99 under {@value #HEALTH_P99_MS} ms and none over
 * {@value #HEALTH_MAX_MS} ms or failed; the daemon's RSS under {@value #RSS_MIB} MiB; every 1 s
 * TTL session gone within {@value #TTL_EXPIRY_MS} ms of its last call. Each flooding stream is
 * cut off after {@value #STALL_MS} ms of unread replies with RESOURCE_EXHAUSTED naming {@code
 * --stream-stall-timeout-ms}, and its session ends after the grace period.
 */
class ReplyFloodTest {
  static final long STALL_MS = 2000;
  static final long GRACE_MS = 500;
  static final long FLOOD_SECONDS = 15;
  /** The attackers wait this long without a send before reading: the daemon has cut them off by then. */
  static final long PATIENCE_MS = STALL_MS + 3000;
  static final double HEALTH_P99_MS = 500;
  static final double HEALTH_MAX_MS = 2000;
  static final long RSS_MIB = 384;
  static final long TTL_EXPIRY_MS = 3000;
  static final List<String> FLOODS = List.of("release", "notice", "lease");

  @BeforeAll
  static void needRoot() {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run the attackers as another uid");
  }

  /** A daemon in its own JVM whose socket every user may connect to. */
  static DaemonProcess startDaemon(String... extra) {
    List<String> flags = new ArrayList<>(List.of("--socket-mode", "0666", "--stream-stall-timeout-ms",
        Long.toString(STALL_MS), "--keepalive-grace-ms", Long.toString(GRACE_MS)));
    flags.addAll(Arrays.asList(extra));
    DaemonProcess daemon = DaemonProcess.start(flags.toArray(String[]::new));
    OtherUser.openUp(daemon.dir());
    return daemon;
  }

  @Test
  void floodsThatNeverReadTheirStreams_slowOnlyThemselves_andAreCutOff() throws Exception {
    List<AttackerProcess> attackers = new ArrayList<>();
    try (DaemonProcess daemon = startDaemon();
         TestChannel probe = new TestChannel(daemon.unixTarget());
         HealthMonitor monitor = new HealthMonitor(probe.channel(), daemon.process().pid())) {
      Thread.sleep(2000); // both JVMs compile the health path first
      HealthMonitor.Figures idle = monitor.figures();
      monitor.reset();
      long t0 = System.nanoTime();
      for (String mode : FLOODS) {
        attackers.add(AttackerProcess.start(KeepAliveFloodMain.class, daemon.unixTarget(), mode,
            Long.toString(FLOOD_SECONDS), Long.toString(PATIENCE_MS)));
      }
      HealthMonitor.Figures flood;
      List<Map<String, String>> results = new ArrayList<>();
      try (Bystander bystander = new Bystander(daemon.unixTarget(), "bystander");
           TtlProbe ttl = new TtlProbe(probe.channel())) {
        for (AttackerProcess attacker : attackers) {
          results.add(attacker.result(FLOOD_SECONDS + 60));
        }
        flood = monitor.figures();
        ttl.close();
        bystander.close();
        System.out.printf("reply flood, %d attackers, %.1f s: idle %s; flooded %s; bystander %s; 1 s-TTL sessions "
            + "ended after %s ms; OutOfMemoryErrors logged: %d%n", attackers.size(), (System.nanoTime() - t0) / 1e9,
            idle, flood, bystander, ttl.expiryMillis(), daemon.output().lines()
                .filter(l -> l.contains("OutOfMemoryError")).count());
        results.forEach(r -> System.out.println(r.get("output").lines().filter(l -> l.startsWith("RESULT"))
            .findFirst().orElse("no RESULT")));

        assertTrue(daemon.process().isAlive(), "the daemon died:\n" + tail(daemon.output()));
        assertEquals(0, flood.failures(), "health checks failed or missed their deadline: " + flood);
        assertTrue(flood.p99Ms() < HEALTH_P99_MS, "health p99: " + flood);
        assertTrue(flood.maxMs() < HEALTH_MAX_MS, "health max: " + flood);
        assertTrue(flood.maxRssMib() < RSS_MIB, "daemon RSS: " + flood);
        assertEquals(0, bystander.failures(), "another tenant's leases: " + bystander);
        assertEquals(0, bystander.corruptions(), "another tenant's bytes: " + bystander);
        assertTrue(bystander.ops() >= 20, "another tenant's leases: " + bystander);
        assertEquals(List.of(), ttl.failures(), "1 s-TTL sessions");
        assertTrue(ttl.expiryMillis().size() >= 3, "1 s-TTL sessions probed: " + ttl.expiryMillis());
        assertTrue(ttl.expiryMillis().stream().allMatch(ms -> ms < TTL_EXPIRY_MS),
            "1 s-TTL sessions ended after " + ttl.expiryMillis() + " ms");
      }

      List<String> floodSessions = new ArrayList<>();
      for (Map<String, String> r : results) {
        String out = r.get("output");
        assertEquals("0", r.get("readBeforeAsked"), "the attacker read its stream, so it proves nothing: " + out);
        assertTrue(Long.parseLong(r.get("sent")) > 0, out);
        int rounds = Integer.parseInt(r.get("rounds"));
        assertTrue(rounds >= 1, out);
        assertEquals(String.join(",", Collections.nCopies(rounds, "RESOURCE_EXHAUSTED")), r.get("statuses"),
            "every flooding stream is cut off: " + out);
        String message = URLDecoder.decode(r.get("message"), StandardCharsets.UTF_8);
        assertTrue(message.contains("--stream-stall-timeout-ms"), "the status names the flag: " + message);
        assertEquals(Integer.toString(rounds), r.get("stalls"), "the daemon stopped taking requests each round: " + out);
        floodSessions.addAll(Arrays.asList(r.get("sessions").split(",")));
      }
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(probe.channel());
      assertEquals(Set.of(), AdminQueries.awaitEnded(admin, floodSessions, GRACE_MS + 3000),
          "flooding sessions end after the grace period");
      assertEquals(HealthCheckResponse.ServingStatus.SERVING, HealthGrpc.newBlockingStub(probe.channel())
          .withDeadlineAfter(5, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance()).getStatus());
      assertTrue(daemon.process().isAlive(), tail(daemon.output()));
    } finally {
      attackers.forEach(AttackerProcess::close);
    }
  }

  @Test
  void oneMessageOf400000Entries_endsTheStreamWithInvalidArgument_andChangesNothing() throws Exception {
    try (DaemonProcess daemon = startDaemon();
         TestChannel probe = new TestChannel(daemon.unixTarget());
         AttackerProcess attacker = AttackerProcess.start(KeepAliveFloodMain.class, daemon.unixTarget(), "huge", "0",
             "0")) {
      Map<String, String> r = attacker.result(60);
      String out = r.get("output");
      System.out.println("one message of 400,000 entries: " + out.lines().filter(l -> l.startsWith("RESULT"))
          .findFirst().orElse("no RESULT"));
      assertEquals("INVALID_ARGUMENT", r.get("statuses"), out);
      String message = URLDecoder.decode(r.get("message"), StandardCharsets.UTF_8);
      assertTrue(message.contains("8192"), "the status names the bound: " + message);
      assertEquals("0", r.get("releaseFailed"), "none of the message's entries was acted on: " + out);
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(probe.channel());
      assertEquals(Set.of(), AdminQueries.awaitEnded(admin, List.of(r.get("sessions")), GRACE_MS + 3000),
          "its session ends after the grace period");
      assertEquals(HealthCheckResponse.ServingStatus.SERVING, HealthGrpc.newBlockingStub(probe.channel())
          .withDeadlineAfter(5, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance()).getStatus());
    }
  }

  /** The last 60 lines of a daemon's output, for a failure message. */
  static String tail(String output) {
    List<String> lines = output.lines().toList();
    return String.join("\n", lines.subList(Math.max(0, lines.size() - 60), lines.size()));
  }
}
