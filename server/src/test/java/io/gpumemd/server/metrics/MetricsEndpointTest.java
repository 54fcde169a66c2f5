package io.gpumemd.server.metrics;

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
         GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
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
}
