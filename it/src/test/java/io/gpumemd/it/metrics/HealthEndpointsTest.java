package io.gpumemd.it.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * {@code /healthz} and {@code /readyz}, the probes the Kubernetes manifests use, against the real
 * daemon in its own JVM: ready once started, not ready (but alive) while SIGTERM drains a held
 * lease, and not ready when what clients need is gone from under it (its socket files, the host
 * backend's shm directory).
 */
class HealthEndpointsTest {
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

  private static int freePort() throws Exception {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }

  private static DaemonProcess daemon(String... flags) throws Exception {
    String[] all = new String[flags.length + 4];
    all[0] = "--metrics-host";
    all[1] = "127.0.0.1";
    all[2] = "--metrics-port";
    all[3] = Integer.toString(freePort());
    System.arraycopy(flags, 0, all, 4, flags.length);
    return DaemonProcess.start(all);
  }

  private HttpResponse<String> get(DaemonProcess daemon, String path) throws Exception {
    return http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + daemon.metricsPort() + path))
        .timeout(Duration.ofSeconds(10)).build(), HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void readyz_isReadyOnceStarted_then503WhileSigtermDrains_whileHealthzStaysOk() throws Exception {
    DaemonProcess daemon = daemon("--drain-timeout-ms", "60000");
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      HttpResponse<String> ready = get(daemon, "/readyz");
      assertEquals(200, ready.statusCode(), ready.body());
      assertEquals("ready\n", ready.body());
      assertEquals("ok\n", get(daemon, "/healthz").body());

      Lease lease = client.lease(0, 1 << 20);
      daemon.sigterm();
      assertTrue(daemon.awaitLine("Shutting down", 10_000), daemon.output());
      HttpResponse<String> draining = get(daemon, "/readyz");
      assertEquals(503, draining.statusCode(), draining.body());
      assertEquals("draining: shutting down, 1 lease(s) still held\n", draining.body());
      HttpResponse<String> alive = get(daemon, "/healthz");
      assertEquals(200, alive.statusCode(), "alive while draining: a liveness probe must not kill the drain");

      lease.close(); // the last lease back: the drain ends and the daemon exits
      assertEquals(0, daemon.awaitExit(15_000), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void readyz_socketFileRemoved_is503NamingIt() throws Exception {
    DaemonProcess daemon = daemon();
    try {
      assertEquals(200, get(daemon, "/readyz").statusCode());
      Path socket = daemon.dir().resolve("gpumemd.sock");
      Files.delete(socket);
      HttpResponse<String> gone = get(daemon, "/readyz");
      assertEquals(503, gone.statusCode(), gone.body());
      assertEquals("socket " + socket + " is gone: no client can connect (restart the daemon to bind it again)\n",
          gone.body());
      assertEquals(200, get(daemon, "/healthz").statusCode(), "the process still runs");
      assertEquals(0, daemon.terminate(15_000), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void readyz_fdSocketReplaced_is503NamingIt() throws Exception {
    DaemonProcess daemon = daemon("--host-segments", "fd");
    try {
      assertEquals(200, get(daemon, "/readyz").statusCode());
      Path fdSocket = daemon.dir().resolve("gpumemd.sock.fd");
      assertTrue(Files.exists(fdSocket), "the fd channel's socket beside the gRPC one");
      Files.delete(fdSocket);
      Files.writeString(fdSocket, "not a socket");
      HttpResponse<String> replaced = get(daemon, "/readyz");
      assertEquals(503, replaced.statusCode(), replaced.body());
      assertEquals("fd socket " + fdSocket + " was replaced by another file: clients reach something else\n",
          replaced.body());
      Files.delete(fdSocket);
      assertEquals(0, daemon.terminate(15_000), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void readyz_shmDirectoryRemoved_is503NamingIt() throws Exception {
    DaemonProcess daemon = daemon();
    try {
      assertEquals(200, get(daemon, "/readyz").statusCode());
      // the daemon's own subdirectory of --shm-dir: what a /dev/shm cleaner would remove
      Path root;
      try (Stream<Path> lock = Files.walk(daemon.shmDir())) {
        root = lock.filter(p -> p.getFileName().toString().equals(".gpumemd.lock")).findFirst()
            .orElseThrow().getParent();
      }
      try (Stream<Path> walk = Files.walk(root)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
      HttpResponse<String> gone = get(daemon, "/readyz");
      assertEquals(503, gone.statusCode(), gone.body());
      assertEquals("host backend: shm directory " + root + " is gone: no new segment can be made\n", gone.body());
      assertEquals(0, daemon.terminate(15_000), daemon.output());
    } finally {
      daemon.close();
    }
  }
}
