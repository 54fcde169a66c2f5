package io.gpumemd.it.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.server.testing.TestDaemon;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import org.junit.jupiter.api.Test;

/** {@code /metrics} over HTTP carries the pool figures tagged by device, matching GetStats. */
class MetricsEndpointTest {
  private static int freePort() throws Exception {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }

  @Test
  void scrape_reportsCountersAndLatencyPerDevice() throws Exception {
    int port = freePort();
    try (TestDaemon daemon = TestDaemon.start("--metrics-port", Integer.toString(port), "--metrics-host", "127.0.0.1");
         GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      client.lease(1, 4096).close();
      client.lease(1, 4096).close();
      HttpClient http = HttpClient.newHttpClient();
      HttpResponse<String> response = http.send(
          HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/metrics")).build(),
          HttpResponse.BodyHandlers.ofString());
      assertEquals(200, response.statusCode());
      String text = response.body();
      assertTrue(text.contains("gpumemd_pool_hits_total{device=\"1\"} 1.0"), text);
      assertTrue(text.contains("gpumemd_pool_misses_total{device=\"1\"} 1.0"), text);
      assertTrue(text.contains("gpumemd_pool_returns_total{device=\"1\"} 2.0"), text);
      assertTrue(text.contains("gpumemd_pool_hits_total{device=\"0\"} 0.0"), text);
      assertTrue(text.contains("gpumemd_pool_cached_bytes{device=\"1\"} 2097152.0"), text);
      assertTrue(text.contains("gpumemd_lease_latency_seconds_count{device=\"1\",result=\"hit\"} 1"), text);
      assertTrue(text.contains("gpumemd_lease_latency_seconds{device=\"1\",result=\"hit\",quantile=\"0.99\"}"), text);
      assertTrue(text.contains("gpumemd_backend_allocs_total{device=\"1\"} 1.0"), text);
      assertEquals(404, http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/")).build(),
          HttpResponse.BodyHandlers.ofString()).statusCode());
    }
  }

  @Test
  void scrape_agreesWithGetStats_forEveryPoolFigure() throws Exception {
    int port = freePort();
    try (TestDaemon daemon = TestDaemon.start("--metrics-port", Integer.toString(port), "--metrics-host", "127.0.0.1");
         GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      java.util.List<io.gpumemd.client.Lease> held = new java.util.ArrayList<>();
      for (int i = 0; i < 6; i++) {
        held.add(client.lease(i % 2, (i + 1) * 700_000L));
      }
      held.remove(0).close();
      held.remove(0).close();
      client.lease(0, 700_000).close();
      daemon.server().pools().get(1).trim(0);
      String text = HttpClient.newHttpClient().send(
          HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/metrics")).build(),
          HttpResponse.BodyHandlers.ofString()).body();
      io.gpumemd.proto.v1.GetStatsResponse stats;
      try (io.gpumemd.client.Channels.Connection admin = io.gpumemd.client.Channels.open(daemon.tcpTarget())) {
        stats = io.gpumemd.proto.v1.AdminGrpc.newBlockingStub(admin.channel())
            .getStats(io.gpumemd.proto.v1.GetStatsRequest.getDefaultInstance());
      }
      java.util.Map<String, String> names = new java.util.LinkedHashMap<>();
      names.put("hits", "gpumemd_pool_hits_total");
      names.put("misses", "gpumemd_pool_misses_total");
      names.put("returns", "gpumemd_pool_returns_total");
      names.put("evictions", "gpumemd_pool_evictions_total");
      names.put("alloc_retries", "gpumemd_pool_alloc_retries_total");
      names.put("ooms", "gpumemd_pool_ooms_total");
      names.put("leased_bytes", "gpumemd_pool_leased_bytes");
      names.put("cached_bytes", "gpumemd_pool_cached_bytes");
      names.put("reserved_bytes", "gpumemd_pool_reserved_bytes");
      names.put("remainder_bytes", "gpumemd_pool_remainder_bytes");
      names.put("peak_leased_bytes", "gpumemd_pool_peak_leased_bytes");
      names.put("active_leases", "gpumemd_pool_active_leases");
      names.put("cached_blocks", "gpumemd_pool_cached_blocks");
      names.put("segments", "gpumemd_pool_segments");
      names.put("retention_cap_bytes", "gpumemd_pool_retention_cap_bytes");
      names.put("capacity_bytes", "gpumemd_pool_capacity_bytes");
      names.put("limit_bytes", "gpumemd_pool_limit_bytes");
      names.put("backend_allocs", "gpumemd_backend_allocs_total");
      names.put("backend_frees", "gpumemd_backend_frees_total");
      for (io.gpumemd.proto.v1.DeviceStats device : stats.getDevicesList()) {
        for (var entry : names.entrySet()) {
          var field = io.gpumemd.proto.v1.DeviceStats.getDescriptor().findFieldByName(entry.getKey());
          long expected = (Long) device.getField(field);
          java.util.regex.Matcher m = java.util.regex.Pattern.compile("(?m)^" + entry.getValue()
              + "\\{device=\"" + device.getDevice() + "\"\\} (\\S+)$").matcher(text);
          assertTrue(m.find(), entry.getValue() + " for device " + device.getDevice() + " missing");
          assertEquals(expected, (long) Double.parseDouble(m.group(1)),
              entry.getValue() + "{device=" + device.getDevice() + "} vs GetStats " + entry.getKey());
        }
      }
      assertTrue(stats.getDevices(1).getEvictions() > 0, "the scenario exercised evictions");
      held.forEach(io.gpumemd.client.Lease::close);
    }
  }
}
