package io.gpumemd.server.metrics;

import com.sun.net.httpserver.HttpServer;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * Serves {@code GET /metrics} in the Prometheus text format from the JDK's built-in HTTP
 * server (one thread: scrapes are rare). Anything else is 404.
 */
public final class MetricsHttpServer implements AutoCloseable {
  private final HttpServer server;
  private final ExecutorService executor;

  /**
   * @param beforeScrape runs on the metrics thread before each scrape (takes the snapshot the
   *     pool meters read)
   * @throws IOException when the address cannot be bound
   */
  public MetricsHttpServer(String host, int port, PrometheusMeterRegistry registry, Runnable beforeScrape)
      throws IOException {
    server = HttpServer.create(new InetSocketAddress(host, port), 16);
    executor = Executors.newSingleThreadExecutor(r -> {
      Thread t = new Thread(r, "gpumemd-metrics");
      t.setDaemon(true);
      return t;
    });
    server.setExecutor(executor);
    server.createContext("/", exchange -> {
      try (exchange) {
        if (!exchange.getRequestURI().getPath().equals("/metrics")) {
          byte[] body = "not found: try /metrics\n".getBytes(StandardCharsets.UTF_8);
          exchange.sendResponseHeaders(404, body.length);
          exchange.getResponseBody().write(body);
          return;
        }
        beforeScrape.run();
        byte[] body = registry.scrape().getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
        exchange.sendResponseHeaders(200, body.length);
        try (OutputStream out = exchange.getResponseBody()) {
          out.write(body);
        }
      }
    });
    server.start();
  }

  public int port() {
    return server.getAddress().getPort();
  }

  @Override
  public void close() {
    server.stop(0);
    executor.shutdownNow();
  }
}
