package io.gpumemd.it.bench;

import io.gpumemd.client.Channels;
import io.gpumemd.it.hardening.HealthMonitor;
import io.gpumemd.it.hardening.LocalAttacks;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.server.testing.DaemonProcess;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The abuse cases of issue 15, rerun against a daemon in its own JVM with its default limits,
 * each for a few seconds, while health checks go over the Unix socket every 20 ms and the
 * daemon's RSS is sampled: a session flood from 8 threads, 3,000 idle TCP connections (beyond
 * {@code --tcp-max-connections}), and 40 half-sent requests to the metrics port with a scrape
 * every 200 ms. Prints, per phase, health latency (p50, p99, max), the most RSS seen, and what
 * the abuse got; then lists every session page by page, as gpumemctl does. The attacks live in
 * {@link LocalAttacks}, shared with the abuse soak. Run:
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
    long phaseMillis = TimeUnit.SECONDS.toMillis(PHASE_SECONDS);
    try (Channels.Connection probe = Channels.open(daemon.unixTarget());
         HealthMonitor monitor = new HealthMonitor(probe.channel(), pid)) {
      System.out.printf("daemon pid %d, default limits; health over the Unix socket every 20 ms%n%n", pid);
      System.out.printf("%-34s %10s %10s %10s %10s  %s%n", "phase", "health p50", "p99", "max", "max RSS", "what the abuse got");

      // Not reported: both JVMs compile the health path first.
      Thread.sleep(TimeUnit.SECONDS.toMillis(3));
      monitor.reset();
      Thread.sleep(phaseMillis);
      report("idle (baseline)", monitor, "");

      monitor.reset();
      Map<String, Long> opens = LocalAttacks.sessionFlood(daemon.unixTarget(), 8, phaseMillis);
      report("session flood, 8 threads", monitor, "OpenSession: " + opens.toString().replace("=", " "));

      monitor.reset();
      LocalAttacks.Idle idle = LocalAttacks.idleConnections(daemon.tcpTarget(), 3000, phaseMillis);
      report("3,000 idle TCP connections", monitor, idle.opened() + " connected, " + idle.keptOpen()
          + " kept open by the daemon");

      monitor.reset();
      LocalAttacks.Slowloris slow = LocalAttacks.slowloris(metricsPort, 40, phaseMillis);
      report("40 half-sent metrics requests", monitor, String.format("%d scrapes ok (max %.1f ms), %d failed",
          slow.scrapesOk(), slow.maxScrapeMs(), slow.scrapesFailed()));

      System.out.println();
      System.out.println(listAll(probe));
    } finally {
      daemon.close();
    }
  }

  private static void report(String phase, HealthMonitor monitor, String got) {
    HealthMonitor.Figures f = monitor.figures();
    System.out.printf("%-34s %7.1f ms %7.1f ms %7.1f ms %6d MiB  %s%s%n", phase, f.p50Ms(), f.p99Ms(), f.maxMs(),
        f.maxRssMib(), got, f.failures() > 0 ? " (" + f.failures() + " health checks failed)" : "");
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
}
