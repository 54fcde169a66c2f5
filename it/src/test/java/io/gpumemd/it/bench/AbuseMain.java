package io.gpumemd.it.bench;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthGrpc;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The abuse cases of issue 15, rerun against a daemon in its own JVM with its default limits,
 * each for a few seconds, while health checks go over the Unix socket every 20 ms and the
 * daemon's RSS is sampled: a session flood from 8 threads, 3,000 idle TCP connections (beyond
 * {@code --tcp-max-connections}), and 40 half-sent requests to the metrics port with a scrape
 * every 200 ms. Prints, per phase, health latency (p50, p99, max), the most RSS seen, and what
 * the abuse got; then lists every session page by page, as gpumemctl does. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.AbuseMain
 * </pre>
 */
public final class AbuseMain {
  private static final long PHASE_SECONDS = 6;

  private AbuseMain() {}

  public static void main(String[] args) throws Exception {
    int metricsPort;
    try (ServerSocket free = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      metricsPort = free.getLocalPort();
    }
    DaemonProcess daemon = DaemonProcess.start("--metrics-host", "127.0.0.1", "--metrics-port",
        Integer.toString(metricsPort), "--log-level", "INFO");
    long pid = daemon.process().pid();
    try (Channels.Connection probe = Channels.open(daemon.unixTarget())) {
      Monitor monitor = new Monitor(probe, pid);
      monitor.start();
      System.out.printf("daemon pid %d, default limits; health over the Unix socket every 20 ms%n%n", pid);
      System.out.printf("%-34s %10s %10s %10s %10s  %s%n", "phase", "health p50", "p99", "max", "max RSS", "what the abuse got");

      // Not reported: both JVMs compile the health path first.
      Thread.sleep(TimeUnit.SECONDS.toMillis(3));
      monitor.phase("idle (baseline)");
      Thread.sleep(TimeUnit.SECONDS.toMillis(PHASE_SECONDS));
      monitor.report("");

      monitor.phase("session flood, 8 threads");
      monitor.report(sessionFlood(daemon.unixTarget()));

      monitor.phase("3,000 idle TCP connections");
      monitor.report(idleConnections(daemon.tcpTarget()));

      monitor.phase("40 half-sent metrics requests");
      monitor.report(slowloris(metricsPort));

      monitor.stop();
      System.out.println();
      System.out.println(listAll(probe));
    } finally {
      daemon.close();
    }
  }

  private static String sessionFlood(String target) throws InterruptedException {
    Map<String, AtomicLong> outcomes = new ConcurrentHashMap<>();
    AtomicBoolean stop = new AtomicBoolean();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < 8; t++) {
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
      });
      thread.start();
      threads.add(thread);
    }
    Thread.sleep(TimeUnit.SECONDS.toMillis(PHASE_SECONDS));
    stop.set(true);
    for (Thread thread : threads) {
      thread.join();
    }
    return "OpenSession: " + new TreeMap<>(Map.copyOf(outcomes)).toString().replace("=", " ");
  }

  private static String idleConnections(String tcpTarget) throws Exception {
    int port = Integer.parseInt(tcpTarget.substring(tcpTarget.lastIndexOf(':') + 1));
    List<Socket> sockets = new ArrayList<>();
    int opened = 0;
    try {
      for (int i = 0; i < 3000; i++) {
        try {
          sockets.add(new Socket(InetAddress.getLoopbackAddress(), port));
          opened++;
        } catch (IOException e) {
          break;
        }
      }
      Thread.sleep(TimeUnit.SECONDS.toMillis(PHASE_SECONDS));
      int stillOpen = 0;
      for (Socket s : sockets) {
        s.setSoTimeout(1);
        try {
          stillOpen += s.getInputStream().read() == -1 ? 0 : 1;
        } catch (java.net.SocketTimeoutException e) {
          stillOpen++; // nothing to read, not closed: the daemon kept it
        } catch (IOException e) {
          // reset: closed by the daemon
        }
      }
      return opened + " connected, " + stillOpen + " kept open by the daemon";
    } finally {
      for (Socket s : sockets) {
        s.close();
      }
    }
  }

  private static String slowloris(int metricsPort) throws Exception {
    List<Socket> slow = new ArrayList<>();
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();
    List<Long> scrapes = new ArrayList<>();
    int failed = 0;
    try {
      for (int i = 0; i < 40; i++) {
        Socket s = new Socket(InetAddress.getLoopbackAddress(), metricsPort);
        s.getOutputStream().write("GET /metrics HTTP/1.1\r\nHost: x\r\n".getBytes(StandardCharsets.US_ASCII));
        slow.add(s);
      }
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(PHASE_SECONDS);
      while (System.nanoTime() < end) {
        long t0 = System.nanoTime();
        try {
          HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + metricsPort + "/metrics"))
              .timeout(Duration.ofSeconds(10)).build(), HttpResponse.BodyHandlers.ofString());
          if (r.statusCode() == 200) {
            scrapes.add(System.nanoTime() - t0);
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
    Collections.sort(scrapes);
    return String.format("%d scrapes ok (max %.1f ms), %d failed",
        scrapes.size(), scrapes.isEmpty() ? 0 : scrapes.get(scrapes.size() - 1) / 1e6, failed);
  }

  private static String listAll(Channels.Connection connection) {
    AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(connection.channel());
    long t0 = System.nanoTime();
    int sessions = 0;
    int pages = 0;
    String token = "";
    do {
      ListSessionsResponse page = admin.listSessions(ListSessionsRequest.newBuilder().setPageToken(token).build());
      sessions += page.getSessionsCount();
      pages++;
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return String.format("ListSessions afterwards: %d sessions in %d pages, %.0f ms", sessions, pages,
        (System.nanoTime() - t0) / 1e6);
  }

  /** Health checks every 20 ms and RSS samples, collected per phase. */
  private static final class Monitor {
    private final HealthGrpc.HealthBlockingStub health;
    private final Path status;
    private final List<Long> latencies = Collections.synchronizedList(new ArrayList<>());
    private final AtomicLong maxRssKb = new AtomicLong();
    private final AtomicLong failures = new AtomicLong();
    private final AtomicBoolean running = new AtomicBoolean(true);
    private Thread thread;
    private String phase;

    Monitor(Channels.Connection connection, long pid) {
      this.health = HealthGrpc.newBlockingStub(connection.channel());
      this.status = Path.of("/proc/" + pid + "/status");
    }

    void start() {
      thread = new Thread(() -> {
        while (running.get()) {
          long t0 = System.nanoTime();
          try {
            health.withDeadlineAfter(5, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance());
            latencies.add(System.nanoTime() - t0);
          } catch (StatusRuntimeException e) {
            failures.incrementAndGet();
          }
          maxRssKb.accumulateAndGet(rssKb(), Math::max);
          try {
            Thread.sleep(20);
          } catch (InterruptedException e) {
            return;
          }
        }
      });
      thread.setDaemon(true);
      thread.start();
    }

    void phase(String name) {
      phase = name;
      latencies.clear();
      maxRssKb.set(0);
      failures.set(0);
    }

    void report(String got) {
      List<Long> sorted;
      synchronized (latencies) {
        sorted = new ArrayList<>(latencies);
      }
      Collections.sort(sorted);
      double p50 = sorted.isEmpty() ? 0 : sorted.get(sorted.size() / 2) / 1e6;
      double p99 = sorted.isEmpty() ? 0 : sorted.get(Math.min(sorted.size() - 1, (int) (sorted.size() * 0.99))) / 1e6;
      double max = sorted.isEmpty() ? 0 : sorted.get(sorted.size() - 1) / 1e6;
      System.out.printf("%-34s %7.1f ms %7.1f ms %7.1f ms %6d MiB  %s%s%n", phase, p50, p99, max, maxRssKb.get() / 1024,
          got, failures.get() > 0 ? " (" + failures.get() + " health checks failed)" : "");
    }

    void stop() throws InterruptedException {
      running.set(false);
      thread.join();
    }

    private long rssKb() {
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
  }
}
