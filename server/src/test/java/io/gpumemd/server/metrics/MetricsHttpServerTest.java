package io.gpumemd.server.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.LogCapture;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.BindException;
import java.net.InetAddress;
import java.net.Socket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The metrics endpoint under clients that misbehave: half-sent requests (a slowloris) do not
 * stall other scrapes and are dropped at the deadline, connections beyond the bound are closed,
 * and oversized or non-GET requests get their own answer.
 */
class MetricsHttpServerTest {
  private final PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
  private final AtomicInteger scrapes = new AtomicInteger();
  /** What the readiness check answers: null (ready) or a reason. */
  private final AtomicReference<String> readiness = new AtomicReference<>();
  private MetricsHttpServer server;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();

  @BeforeEach
  void start() throws IOException {
    registry.counter("gpumemd.test").increment();
    server = new MetricsHttpServer("127.0.0.1", 0, registry, scrapes::incrementAndGet, readiness::get);
  }

  @AfterEach
  void stop() {
    server.close();
  }

  private HttpResponse<String> get(String path) throws Exception {
    return http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + path))
        .timeout(Duration.ofSeconds(2)).build(), HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void scrape_servesTheRegistry_andOtherPathsAre404() throws Exception {
    HttpResponse<String> ok = get("/metrics");
    assertEquals(200, ok.statusCode());
    assertTrue(ok.body().contains("gpumemd_test_total 1.0"), ok.body());
    assertTrue(ok.headers().firstValue("content-type").orElse("").startsWith("text/plain; version=0.0.4"));
    assertEquals(1, scrapes.get());
    assertEquals(404, get("/other").statusCode());
    HttpResponse<String> post = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + "/metrics"))
        .POST(HttpRequest.BodyPublishers.ofString("x")).timeout(Duration.ofSeconds(2)).build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(405, post.statusCode());
  }

  @Test
  void healthz_isOkWithoutScraping() throws Exception {
    readiness.set("draining: shutting down, 1 lease(s) still held");
    HttpResponse<String> alive = get("/healthz");
    assertEquals(200, alive.statusCode(), "alive even while not ready");
    assertEquals("ok\n", alive.body());
    assertEquals(0, scrapes.get(), "a probe takes no snapshot of the pools");
  }

  @Test
  void readyz_followsTheCheck_503WithItsReason() throws Exception {
    HttpResponse<String> ready = get("/readyz");
    assertEquals(200, ready.statusCode());
    assertEquals("ready\n", ready.body());
    readiness.set("socket /run/gpumemd/gpumemd.sock is gone\nsecond line");
    HttpResponse<String> notReady = get("/readyz");
    assertEquals(503, notReady.statusCode());
    assertEquals("socket /run/gpumemd/gpumemd.sock is gone second line\n", notReady.body(), "one line");
    assertTrue(notReady.headers().firstValue("content-type").orElse("").startsWith("text/plain"));
    readiness.set(null);
    assertEquals(200, get("/readyz").statusCode(), "ready again once the problem is gone");
    assertEquals(0, scrapes.get());
  }

  @Test
  void readyz_aCheckThatThrows_isNotReady_andTheServerCarriesOn() throws Exception {
    try (MetricsHttpServer other = new MetricsHttpServer("127.0.0.1", 0, registry, () -> { }, () -> {
      throw new IllegalStateException("boom");
    })) {
      HttpResponse<String> answer = http.send(HttpRequest.newBuilder(
          URI.create("http://127.0.0.1:" + other.port() + "/readyz")).timeout(Duration.ofSeconds(2)).build(),
          HttpResponse.BodyHandlers.ofString());
      assertEquals(503, answer.statusCode());
      assertEquals("readiness check failed: java.lang.IllegalStateException: boom\n", answer.body());
    }
    assertEquals(200, get("/healthz").statusCode());
  }

  @Test
  void unknownPath_namesTheEndpoints() throws Exception {
    HttpResponse<String> missing = get("/health");
    assertEquals(404, missing.statusCode());
    assertEquals("not found: try /metrics, /healthz or /readyz\n", missing.body());
  }

  @Test
  void halfSentRequests_doNotStallScrapes_andAreDroppedAtTheDeadline() throws Exception {
    List<Socket> slow = new ArrayList<>();
    try {
      for (int i = 0; i < 8; i++) {
        Socket s = new Socket(InetAddress.getLoopbackAddress(), server.port());
        s.getOutputStream().write("GET /metrics HTTP/1.1\r\nHost: x\r\n".getBytes(StandardCharsets.US_ASCII));
        s.getOutputStream().flush();
        slow.add(s);
      }
      long t0 = System.nanoTime();
      assertEquals(200, get("/metrics").statusCode(), "a scrape while eight requests hang half-sent");
      assertTrue(System.nanoTime() - t0 < 1_500_000_000L, "served without waiting for the slow ones");
      // The half-sent ones are closed by the server once the deadline passes.
      Socket first = slow.get(0);
      first.setSoTimeout((MetricsHttpServer.REQUEST_DEADLINE_SECONDS + 3) * 1000);
      InputStream in = first.getInputStream();
      assertEquals(-1, in.read(), "the server closed the connection that never finished its request");
    } finally {
      for (Socket s : slow) {
        s.close();
      }
    }
  }

  @Test
  void aNewConnectionBeyondTheBound_displacesTheLongestWaiting_soScrapesGoOn() throws Exception {
    List<Socket> idle = new ArrayList<>();
    try {
      for (int i = 0; i < MetricsHttpServer.MAX_CONNECTIONS; i++) {
        idle.add(new Socket(InetAddress.getLoopbackAddress(), server.port()));
      }
      Thread.sleep(200); // all accepted before the scrape
      assertEquals(200, get("/metrics").statusCode(), "a scrape while the bound is taken by idle connections");
      Socket oldest = idle.get(0);
      oldest.setSoTimeout(2000);
      assertEquals(-1, oldest.getInputStream().read(), "the longest-waiting idle connection was closed for it");
      Socket newest = idle.get(idle.size() - 1);
      newest.setSoTimeout(300);
      assertThrows(java.net.SocketTimeoutException.class, () -> newest.getInputStream().read(),
          "a recent idle connection is still open");
    } finally {
      for (Socket s : idle) {
        s.close();
      }
    }
  }

  @Test
  void oversizedRequest_isRefused_andTheServerCarriesOn() throws Exception {
    try (Socket s = new Socket(InetAddress.getLoopbackAddress(), server.port())) {
      s.setSoTimeout(3000);
      String huge = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + "a".repeat(20_000) + "\r\n\r\n";
      s.getOutputStream().write(huge.getBytes(StandardCharsets.US_ASCII));
      String answer = new String(s.getInputStream().readAllBytes(), StandardCharsets.US_ASCII);
      assertTrue(answer.isEmpty() || answer.startsWith("HTTP/1.1 4"), answer);
    } catch (java.net.SocketException reset) {
      // the server may drop it mid-send: also a refusal
    }
    assertEquals(200, get("/metrics").statusCode());
  }

  @Test
  void aMeterThatThrows_isLeftOut_andTheScrapeStillAnswers() throws Exception {
    PrometheusMeterRegistry isolating = IsolatingPrometheusRegistry.newMeterRegistry();
    isolating.counter("gpumemd.test").increment();
    FunctionCounter.builder("gpumemd.broken", this, x -> -2).register(isolating);
    try (MetricsHttpServer other = new MetricsHttpServer("127.0.0.1", 0, isolating, () -> { }, ReadinessCheck.ALWAYS)) {
      HttpResponse<String> ok = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + other.port() + "/metrics"))
          .timeout(Duration.ofSeconds(2)).build(), HttpResponse.BodyHandlers.ofString());
      assertEquals(200, ok.statusCode());
      assertTrue(ok.body().contains("gpumemd_test_total 1.0"), ok.body());
      assertFalse(ok.body().contains("gpumemd_broken"), ok.body());
    }
  }

  @Test
  void aScrapeThatFailsAnyway_isA500_loggedAtWarnOnce() throws Exception {
    // Micrometer's own registry fails whole on one bad meter: the server still answers.
    FunctionCounter.builder("gpumemd.broken", this, x -> -2).register(registry);
    try (LogCapture log = new LogCapture(MetricsHttpServer.class)) {
      for (int i = 0; i < 2; i++) {
        HttpResponse<String> failed = get("/metrics");
        assertEquals(500, failed.statusCode(), failed.body());
        assertEquals("scrape failed: see the daemon's log\n", failed.body());
      }
      assertEquals(1, log.messages("WARN").size(), log.messages("WARN").toString());
    }
    assertEquals(404, get("/other").statusCode(), "the server carries on");
  }

  @Test
  void takenPort_isABindException() {
    assertThrows(BindException.class, () -> new MetricsHttpServer("127.0.0.1", server.port(), registry, () -> { }, ReadinessCheck.ALWAYS));
  }
}
