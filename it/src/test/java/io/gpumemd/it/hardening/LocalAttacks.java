package io.gpumemd.it.hardening;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.net.InetAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The transport-level abuse of issue 15, each run for a given time and reporting what it got:
 * a session flood, idle TCP connections, half-sent requests to the metrics port. Shared by
 * {@code bench.AbuseMain} (one phase each, as root) and {@link AbuseAttackMain} (as another
 * uid, all at once in {@link AbuseSoakTest}). Stateless; each call blocks for its duration.
 */
public final class LocalAttacks {
  private LocalAttacks() {}

  /** What the idle connections got: how many connected, and how many the daemon still kept open at the end. */
  public record Idle(int opened, int keptOpen) {}

  /** What the metrics scrapes got while the half-sent requests were held open. */
  public record Slowloris(int scrapesOk, double maxScrapeMs, int scrapesFailed) {}

  /**
   * OpenSession from {@code threads} threads, each on its own connection, as fast as the daemon
   * answers, for {@code millis}. Sessions get the daemon's default TTL and no keep-alive.
   *
   * @return how many calls ended how (OK or the status code)
   */
  public static Map<String, Long> sessionFlood(String target, int threads, long millis) throws InterruptedException {
    Map<String, AtomicLong> outcomes = new ConcurrentHashMap<>();
    AtomicBoolean stop = new AtomicBoolean();
    List<Thread> running = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      Thread thread = new Thread(() -> {
        try (Channels.Connection c = Channels.open(target)) {
          AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(c.channel());
          while (!stop.get()) {
            String outcome;
            try {
              allocator.withDeadlineAfter(5, TimeUnit.SECONDS).openSession(
                  OpenSessionRequest.newBuilder().setClientName("flood").build());
              outcome = "OK";
            } catch (StatusRuntimeException e) {
              outcome = e.getStatus().getCode().name();
            }
            outcomes.computeIfAbsent(outcome, k -> new AtomicLong()).incrementAndGet();
          }
        }
      }, "session-flood-" + t);
      thread.start();
      running.add(thread);
    }
    Thread.sleep(millis);
    stop.set(true);
    for (Thread thread : running) {
      thread.join();
    }
    Map<String, Long> counts = new TreeMap<>();
    outcomes.forEach((k, v) -> counts.put(k, v.get()));
    return counts;
  }

  /**
   * Opens up to {@code count} TCP connections to the daemon's gRPC port that never send a byte,
   * holds them {@code millis}, then counts those the daemon kept open.
   */
  public static Idle idleConnections(String tcpTarget, int count, long millis) throws Exception {
    int port = Integer.parseInt(tcpTarget.substring(tcpTarget.lastIndexOf(':') + 1));
    List<Socket> sockets = new ArrayList<>();
    try {
      for (int i = 0; i < count; i++) {
        try {
          sockets.add(new Socket(InetAddress.getLoopbackAddress(), port));
        } catch (IOException e) {
          break;
        }
      }
      Thread.sleep(millis);
      int stillOpen = 0;
      for (Socket s : sockets) {
        s.setSoTimeout(1);
        try {
          stillOpen += s.getInputStream().read() == -1 ? 0 : 1;
        } catch (SocketTimeoutException e) {
          stillOpen++; // nothing to read, not closed: the daemon kept it
        } catch (IOException e) {
          // reset: closed by the daemon
        }
      }
      return new Idle(sockets.size(), stillOpen);
    } finally {
      for (Socket s : sockets) {
        s.close();
      }
    }
  }

  /**
   * Holds {@code connections} requests to the metrics port half-sent (headers never finished)
   * for {@code millis} while scraping {@code /metrics} every 200 ms.
   */
  public static Slowloris slowloris(int metricsPort, int connections, long millis) throws Exception {
    List<Socket> slow = new ArrayList<>();
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();
    int ok = 0;
    int failed = 0;
    double maxMs = 0;
    try {
      for (int i = 0; i < connections; i++) {
        Socket s = new Socket(InetAddress.getLoopbackAddress(), metricsPort);
        s.getOutputStream().write("GET /metrics HTTP/1.1\r\nHost: x\r\n".getBytes(StandardCharsets.US_ASCII));
        slow.add(s);
      }
      long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
      while (System.nanoTime() < end) {
        long t0 = System.nanoTime();
        try {
          HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + metricsPort + "/metrics"))
              .timeout(Duration.ofSeconds(10)).build(), HttpResponse.BodyHandlers.ofString());
          if (r.statusCode() == 200) {
            ok++;
            maxMs = Math.max(maxMs, (System.nanoTime() - t0) / 1e6);
          } else {
            failed++;
          }
        } catch (IOException e) {
          failed++;
        }
        Thread.sleep(200);
      }
    } finally {
      for (Socket s : slow) {
        s.close();
      }
    }
    return new Slowloris(ok, maxMs, failed);
  }
}
