package io.gpumemd.it.hardening;

import io.gpumemd.it.e2e.DeviceBooks;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.grpc.Channel;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * What the other tenants rely on, checked every 500 ms while the daemon is attacked: GetStats'
 * books balance on every device ({@link DeviceBooks#assertBalanced}) with no negative client
 * counter and at most {@code maxHolds} live holds; no session keeps more client-cached bytes
 * than its allowance; and every fourth time, {@code /metrics} answers 200 with the daemon's
 * meters and no negative counter. The first 20 failures are kept, each with what was seen, and
 * the rest counted.
 * Thread-safe: one thread of its own checks; any thread reads.
 */
final class BooksMonitor implements AutoCloseable {
  private final AdminGrpc.AdminBlockingStub admin;
  private final URI metrics;
  private final long maxHolds;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
  private final List<String> failures = Collections.synchronizedList(new ArrayList<>());
  private final AtomicLong failureCount = new AtomicLong();
  private final AtomicLong polls = new AtomicLong();
  private final AtomicLong scrapes = new AtomicLong();
  private final AtomicLong mostHolds = new AtomicLong();
  private final Thread thread;
  private volatile boolean running = true;

  BooksMonitor(Channel channel, int metricsPort, long maxHolds) {
    this.admin = AdminGrpc.newBlockingStub(channel);
    this.metrics = URI.create("http://127.0.0.1:" + metricsPort + "/metrics");
    this.maxHolds = maxHolds;
    thread = new Thread(this::run, "books-monitor");
    thread.setDaemon(true);
    thread.start();
  }

  private void run() {
    while (running) {
      try {
        checkBooks();
        checkAllowances();
        if (polls.incrementAndGet() % 4 == 0) {
          checkMetrics();
        }
      } catch (Throwable t) {
        if (running) {
          fail(t.toString());
        }
      }
      try {
        Thread.sleep(500);
      } catch (InterruptedException e) {
        return;
      }
    }
  }

  private void checkBooks() {
    for (DeviceStats d : admin.withDeadlineAfter(10, TimeUnit.SECONDS).getStats(GetStatsRequest.getDefaultInstance())
        .getDevicesList()) {
      DeviceBooks.assertBalanced(d);
      if (d.getClientCacheHits() < 0 || d.getClientCacheReturns() < 0) {
        fail("device " + d.getDevice() + ": negative client counters: hits " + d.getClientCacheHits()
            + ", returns " + d.getClientCacheReturns());
      }
      mostHolds.accumulateAndGet(d.getLiveHolds(), Math::max);
      if (d.getLiveHolds() > maxHolds) {
        fail("device " + d.getDevice() + ": " + d.getLiveHolds() + " live holds (expected: at most "
            + maxHolds + ", the tenant's bound)");
      }
    }
  }

  private void checkAllowances() {
    for (SessionInfo s : AdminQueries.sessions(admin)) {
      if (s.getClientCachedBytes() > s.getClientCacheAllowanceBytes()) {
        fail("session " + s.getSessionId() + " (" + s.getTenant() + ", '" + s.getClientName() + "'): "
            + s.getClientCachedBytes() + " client-cached bytes over its allowance of "
            + s.getClientCacheAllowanceBytes());
      }
    }
  }

  private void checkMetrics() throws IOException, InterruptedException {
    scrapes.incrementAndGet();
    HttpResponse<String> r = http.send(HttpRequest.newBuilder(metrics).timeout(Duration.ofSeconds(10)).build(),
        HttpResponse.BodyHandlers.ofString());
    if (r.statusCode() != 200 || !r.body().contains("# TYPE gpumemd_")) {
      fail("/metrics: HTTP " + r.statusCode() + ", " + r.body().length() + " characters without the "
          + "daemon's meters");
      return;
    }
    for (String line : r.body().lines().toList()) {
      if (!line.startsWith("#") && line.contains("_total") && line.substring(line.lastIndexOf(' ') + 1).startsWith("-")) {
        fail("/metrics: a negative counter: " + line);
      }
    }
  }

  private void fail(String what) {
    if (failureCount.getAndIncrement() < 20) {
      failures.add(what);
    }
  }

  /** The first 20 failures, and how many more there were. */
  List<String> failures() {
    long more = failureCount.get() - 20;
    synchronized (failures) {
      List<String> all = new ArrayList<>(failures);
      if (more > 0) {
        all.add("... and " + more + " more");
      }
      return all;
    }
  }

  long polls() {
    return polls.get();
  }

  long scrapes() {
    return scrapes.get();
  }

  /** The most live holds seen on one device. */
  long mostHolds() {
    return mostHolds.get();
  }

  @Override
  public void close() throws InterruptedException {
    running = false;
    thread.interrupt();
    thread.join(15_000);
  }
}
