package io.gpumemd.it.hardening;

import io.grpc.Channel;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Watches a daemon process from outside while it is attacked: a health check over the given
 * channel every 20 ms (deadline 5 s), and its resident set size from {@code /proc/PID/status}
 * at each check. {@link #figures} summarises what was seen since the start or the last {@link
 * #reset}. A check that fails or misses its deadline counts as a failure, with its status kept
 * for the report. Thread-safe: one thread of its own checks and samples; any thread reads.
 */
public final class HealthMonitor implements AutoCloseable {
  private static final long INTERVAL_MS = 20;
  private static final long DEADLINE_MS = 5000;

  /** Health latencies in milliseconds and the most RSS seen, over one period. */
  public record Figures(int checks, double p50Ms, double p99Ms, double maxMs, long failures, String firstFailure,
      long maxRssMib) {
    @Override
    public String toString() {
      return String.format("%d health checks: p50 %.1f ms, p99 %.1f ms, max %.1f ms, %d failed%s; max RSS %d MiB",
          checks, p50Ms, p99Ms, maxMs, failures, firstFailure.isEmpty() ? "" : " (first: " + firstFailure + ")",
          maxRssMib);
    }
  }

  private final HealthGrpc.HealthBlockingStub health;
  private final Path status;
  private final List<Long> latencies = Collections.synchronizedList(new ArrayList<>());
  private final AtomicLong maxRssKb = new AtomicLong();
  private final AtomicLong failures = new AtomicLong();
  private volatile String firstFailure = "";
  private final AtomicBoolean running = new AtomicBoolean(true);
  private final Thread thread;

  /** Starts checking {@code channel}'s daemon, whose process is {@code pid}. */
  public HealthMonitor(Channel channel, long pid) {
    this.health = HealthGrpc.newBlockingStub(channel);
    this.status = Path.of("/proc/" + pid + "/status");
    thread = new Thread(this::run, "health-monitor");
    thread.setDaemon(true);
    thread.start();
  }

  private void run() {
    while (running.get()) {
      long t0 = System.nanoTime();
      try {
        HealthCheckResponse.ServingStatus s = health.withDeadlineAfter(DEADLINE_MS, TimeUnit.MILLISECONDS)
            .check(HealthCheckRequest.getDefaultInstance()).getStatus();
        latencies.add(System.nanoTime() - t0);
        if (s != HealthCheckResponse.ServingStatus.SERVING) {
          failed(s.name());
        }
      } catch (StatusRuntimeException e) {
        if (!running.get()) {
          return; // interrupted by close(): not the daemon's failure
        }
        failed(e.getStatus().getCode().name());
      }
      maxRssKb.accumulateAndGet(rssKb(status), Math::max);
      try {
        Thread.sleep(INTERVAL_MS);
      } catch (InterruptedException e) {
        return;
      }
    }
  }

  private void failed(String why) {
    if (failures.getAndIncrement() == 0) {
      firstFailure = why;
    }
  }

  /** Forgets what was seen so far: the next {@link #figures} covers what comes from now on. */
  public void reset() {
    latencies.clear();
    maxRssKb.set(0);
    failures.set(0);
    firstFailure = "";
  }

  public Figures figures() {
    List<Long> sorted;
    synchronized (latencies) {
      sorted = new ArrayList<>(latencies);
    }
    Collections.sort(sorted);
    return new Figures(sorted.size(), percentile(sorted, 0.50), percentile(sorted, 0.99), percentile(sorted, 1.0),
        failures.get(), firstFailure, maxRssKb.get() / 1024);
  }

  private static double percentile(List<Long> sorted, double p) {
    if (sorted.isEmpty()) {
      return 0;
    }
    return sorted.get(Math.min(sorted.size() - 1, (int) (sorted.size() * p))) / 1e6;
  }

  /** The resident set size of the process whose {@code /proc/PID/status} this is, in KiB; 0 once it is gone. */
  public static long rssKb(Path status) {
    try {
      for (String line : Files.readAllLines(status)) {
        if (line.startsWith("VmRSS:")) {
          return Long.parseLong(line.replaceAll("\\D", ""));
        }
      }
    } catch (IOException | NumberFormatException e) {
      return 0;
    }
    return 0;
  }

  @Override
  public void close() throws InterruptedException {
    running.set(false);
    thread.interrupt();
    thread.join(DEADLINE_MS + 1000);
  }
}
