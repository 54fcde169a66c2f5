package io.gpumemd.it.hardening;

import static org.junit.jupiter.api.Assertions.assertAll;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.ResultProcess;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Issue 22's counter attack with real processes: uid 65534, with a raw gRPC client ({@link
 * CounterOverflowMain}), opens two sessions on a daemon whose socket is open to everyone and
 * reports client cache counters of {@code Long.MAX_VALUE} on both KeepAlive streams. Before the
 * fix the pool's figure wrapped to -2: GetStats showed it to every tenant, and every {@code
 * /metrics} scrape failed (no reply at all). Now the figures saturate, and the scrape still
 * answers with every meter it had before the attack, in a well-formed text.
 */
class ClientCounterOverflowTest {
  private static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

  @BeforeAll
  static void needRoot() {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run the attacker as another uid");
  }

  private static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }

  /** The scrape's text, or a failure that says the endpoint gave no answer. */
  private static String scrape(DaemonProcess daemon) throws InterruptedException {
    try {
      HttpResponse<String> response = HTTP.send(HttpRequest.newBuilder(
          URI.create("http://127.0.0.1:" + daemon.metricsPort() + "/metrics")).timeout(Duration.ofSeconds(10)).build(),
          HttpResponse.BodyHandlers.ofString());
      assertEquals(200, response.statusCode(), response.body());
      return response.body();
    } catch (IOException e) {
      return fail("/metrics gave no answer (" + e + "); the daemon's log:\n" + daemon.output());
    }
  }

  @Test
  void overflowingClientCounters_fromAnotherUid_leaveGetStatsNonNegative_andMetricsWhole() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--socket-mode", "0666",
        "--metrics-host", "127.0.0.1", "--metrics-port", Integer.toString(freePort()))) {
      OtherUser.openUp(daemon.dir());
      ExpositionText before = ExpositionText.parse(scrape(daemon));
      assertEquals(List.of(), before.problems(), "the scrape before the attack is well formed");

      List<String> command = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
          CounterOverflowMain.class.getName());
      command.addAll(List.of(daemon.unixTarget(), "2", Long.toString(Long.MAX_VALUE)));
      Map<String, String> attack = ResultProcess.parse(new ProcessBuilder(command).redirectErrorStream(true).start());
      assertEquals("2", attack.get("applied"), "both sessions' reports were taken: " + attack.get("output"));

      List<DeviceStats> stats;
      try (Channels.Connection admin = Channels.open(daemon.unixTarget())) { // uid 0: another tenant
        stats = AdminGrpc.newBlockingStub(admin.channel()).getStats(GetStatsRequest.getDefaultInstance()).getDevicesList();
      }
      assertAll(
          () -> {
            for (DeviceStats d : stats) {
              assertEquals(Long.MAX_VALUE, d.getClientCacheHits(), "saturated, never wrapped: device " + d.getDevice());
              assertEquals(Long.MAX_VALUE, d.getClientCacheReturns(), "saturated, never wrapped: device " + d.getDevice());
            }
          },
          () -> {
            // Each session reported MAX on two devices: its own sum over devices saturates too.
            assertEquals(Long.MAX_VALUE + "," + Long.MAX_VALUE, attack.get("ownHits"), attack.get("output"));
            assertEquals(Long.MAX_VALUE + "," + Long.MAX_VALUE, attack.get("ownReturns"), attack.get("output"));
          },
          () -> assertWhole(before, scrape(daemon)));
      assertEquals(0, daemon.terminate(15_000), daemon.output());
    }
  }

  /** As the README lists them: gpumemd_pool_hits_total, gpumemd_client_cache_hits_total, gpumemd_pool_leased_bytes. */
  private static String prometheusName(PoolMetric metric) {
    String field = metric.protoField();
    String prefix = field.startsWith("backend_") || field.startsWith("client_") ? "gpumemd_" : "gpumemd_pool_";
    return prefix + field + (metric.kind() == PoolMetric.Kind.COUNTER ? "_total" : "");
  }

  /** The scrape after the attack: well formed, every family of the one before, every pool figure per device. */
  private static void assertWhole(ExpositionText before, String text) {
    ExpositionText after = ExpositionText.parse(text);
    assertEquals(List.of(), after.problems(), text);
    Set<String> families = before.families();
    assertTrue(families.size() > PoolMetric.values().length, families.toString());
    assertEquals(families, after.families(), "every meter still answers");
    List<String> missing = new ArrayList<>();
    for (PoolMetric metric : PoolMetric.values()) {
      for (int device = 0; device < 2; device++) {
        String labels = "device=\"" + device + "\"";
        if (after.value(prometheusName(metric), labels) == null) {
          missing.add(prometheusName(metric) + "{" + labels + "}");
        }
      }
    }
    assertEquals(List.of(), missing, "pool figures missing from the scrape");
    assertEquals((double) Long.MAX_VALUE, after.value("gpumemd_client_cache_hits_total", "device=\"0\""), text);
  }
}
