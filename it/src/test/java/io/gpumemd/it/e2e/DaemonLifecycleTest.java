package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.Channels;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/** The real daemon process: start-up messages, exit codes, SIGTERM drain, logs. */
class DaemonLifecycleTest {

  private static long segmentFiles(Path shm) throws Exception {
    if (!Files.exists(shm)) {
      return 0;
    }
    try (Stream<Path> walk = Files.walk(shm)) {
      return walk.filter(p -> p.getFileName().toString().startsWith("seg-")).count();
    }
  }

  /** Runs Main to completion; returns {exit code, output}. */
  private static Object[] runMain(String... args) throws Exception {
    List<String> command = DaemonProcess.javaCommand("io.gpumemd.server.Main");
    command.addAll(List.of(args));
    // Without a GPU: the CUDA driver (real, or the tests' stand-in) sees no device.
    Process p = DaemonProcess.withEnvironment(new ProcessBuilder(command), DaemonProcess.NO_GPU)
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(30, TimeUnit.SECONDS));
    return new Object[] {p.exitValue(), out};
  }

  @Test
  void sigterm_drainsLeases_tellsClients_freesMemory_exitsZero() throws Exception {
    // path segments: the test counts the files left behind
    DaemonProcess daemon = DaemonProcess.start("--drain-timeout-ms", "20000", "--host-segments", "path");
    try {
      assertTrue(daemon.output().contains("Backend: host (--backend host)"), daemon.output());
      assertTrue(daemon.output().contains("Listening on unix://"), daemon.output());
      // where no interface has a MAC address netty warns at the first channel; logback.xml silences it
      assertFalse(daemon.output().contains("usable hardware address"), daemon.output());
      CountDownLatch told = new CountDownLatch(1);
      GpuMemClient client = GpuMemClient.builder(daemon.unixTarget())
          .onShutdownNotice(ms -> told.countDown()).connect();
      Lease lease = client.lease(0, 3 << 20);
      assertEquals(1, segmentFiles(daemon.shmDir()));
      try (Channels.Connection probe = Channels.open(daemon.tcpTarget())) {
        HealthGrpc.HealthBlockingStub health = HealthGrpc.newBlockingStub(probe.channel());
        assertEquals(HealthCheckResponse.ServingStatus.SERVING,
            health.check(HealthCheckRequest.newBuilder().setService("gpumemd.v1.Allocator").build()).getStatus());

        daemon.sigterm();
        assertTrue(told.await(10, TimeUnit.SECONDS), "client told of the shutdown");
        assertEquals(HealthCheckResponse.ServingStatus.NOT_SERVING,
            health.check(HealthCheckRequest.getDefaultInstance()).getStatus());
        GpuMemException refused = assertThrows(GpuMemException.class, () -> client.lease(0, 4096));
        assertEquals(Status.Code.UNAVAILABLE, refused.code());
        assertTrue(daemon.process().isAlive(), "still draining while a lease is held");
      }
      lease.close(); // the last lease comes back: the drain ends
      assertEquals(0, daemon.awaitExit(10_000), daemon.output());
      assertEquals(0, segmentFiles(daemon.shmDir()), "no shared-memory files left");
      assertFalse(Files.exists(daemon.dir().resolve("gpumemd.sock")), "socket removed");
      assertTrue(daemon.output().contains("gpumemd stopped; all device memory freed"), daemon.output());
      client.close();
    } finally {
      daemon.close();
    }
  }

  @Test
  void sigterm_withLeasesHeldPastTheTimeout_stillFreesEverything() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--drain-timeout-ms", "300");
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      client.lease(1, 8 << 20);
      assertEquals(0, daemon.terminate(10_000), daemon.output());
      assertTrue(daemon.output().contains("Drain ended with 1 lease(s) still held"), daemon.output());
      assertEquals(0, segmentFiles(daemon.shmDir()));
    } finally {
      daemon.close();
    }
  }

  @Test
  void secondSigterm_forcesTheShutdown() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--drain-timeout-ms", "600000");
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      client.lease(0, 4096);
      daemon.sigterm();
      assertTrue(daemon.awaitLine("Shutting down", 10_000));
      daemon.sigterm();
      assertEquals(0, daemon.awaitExit(15_000), "forced shutdown did not finish: " + daemon.output());
      assertTrue(daemon.output().contains("Second signal"), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void backendCuda_withoutGpu_failsAtStartWithAClearMessage() throws Exception {
    Path dir = Files.createTempDirectory("gpumemd-cuda-");
    Object[] result = runMain("--backend", "cuda", "--socket", dir.resolve("s.sock").toString(),
        "--listen", "127.0.0.1:0", "--metrics-port", "0", "--shm-dir", dir.resolve("shm").toString());
    String out = (String) result[1];
    assertEquals(1, result[0], out);
    assertTrue(out.contains("backend: cuda (expected: a usable NVIDIA GPU and driver"), out);
    assertTrue(out.contains("Use --backend host or auto"), out);
  }

  @Test
  void backendAuto_withoutGpu_picksHostAndSaysWhy() throws Exception {
    DaemonProcess daemon = DaemonProcess.startWith(DaemonProcess.NO_GPU, "--backend", "auto");
    try {
      assertTrue(daemon.output().contains("Backend: host (--backend auto: CUDA is not usable ("), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void badConfiguration_exitsTwoNamingTheValue() throws Exception {
    Object[] result = runMain("--host-device-bytes", "12 parsecs");
    assertEquals(2, result[0]);
    assertTrue(((String) result[1]).contains("host-device-bytes: '12 parsecs' (expected: a byte size with suffix"),
        (String) result[1]);
    Object[] unknown = runMain("--frobnicate", "1");
    assertEquals(2, unknown[0]);
    assertTrue(((String) unknown[1]).contains("flag: '--frobnicate'"), (String) unknown[1]);
  }

  @Test
  void severalBadValues_exitTwo_withAllOfThemInOneMessage() throws Exception {
    Object[] result = runMain("--host-device-bytes", "12 parsecs", "--metrics-port", "-5");
    String out = (String) result[1];
    assertEquals(2, result[0], out);
    assertTrue(out.startsWith("gpumemd: 2 invalid settings:\n"), out);
    assertTrue(out.contains("\n  host-device-bytes: '12 parsecs' (expected: a byte size with suffix B, KiB, MiB, GiB "
        + "or TiB) [flag --host-device-bytes]\n"), out);
    assertTrue(out.contains("\n  metrics-port: '-5' (expected: an integer in [0, 65535]) [flag --metrics-port]\n"), out);
    assertTrue(out.endsWith("Run with --help for the options.\n"), out);
    assertFalse(out.contains("gpumemd starting"), "a configuration error starts nothing: " + out);
  }

  @Test
  void help_listsEveryFlagWithItsEnvironmentVariable() throws Exception {
    Object[] result = runMain("--help");
    assertEquals(0, result[0]);
    String out = (String) result[1];
    for (String flag : List.of("--socket", "--listen", "--backend", "--metrics-port", "--host-devices",
        "--host-device-bytes", "--shm-dir", "--retention-cap-bytes", "--config")) {
      assertTrue(out.contains(flag), flag + " missing from --help");
    }
    assertTrue(out.contains("GPUMEMD_RETENTION_CAP_BYTES"), out);
    assertTrue(out.startsWith("Usage: java -jar gpumemd.jar"), out);
    assertTrue(out.contains("env GPUMEMD_HOST_DEVICE_BYTES, default 1GiB"), out);
  }

  @Test
  void jsonLogs_areOneObjectPerLine() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--log-format", "json");
    try {
      List<String> lines = daemon.output().lines().filter(l -> !l.isBlank()).toList();
      assertTrue(lines.size() >= 4, daemon.output());
      for (String line : lines) {
        assertTrue(line.startsWith("{") && line.endsWith("}"), "not a JSON object: " + line);
        assertTrue(line.contains("\"level\":\""), line);
      }
      assertTrue(lines.stream().anyMatch(l -> l.contains("gpumemd ready")));
      try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName("json-client").connect()) {
        client.lease(0, 4096);
      }
      assertTrue(daemon.awaitLine("released_leases", 5000), daemon.output());
      String ended = daemon.output().lines().filter(l -> l.contains("released_leases")).findFirst().orElseThrow();
      assertTrue(ended.startsWith("{") && ended.contains("\"client\"") && ended.contains("json-client")
          && ended.contains("\"session\""), "session fields in the JSON event: " + ended);
    } finally {
      daemon.close();
    }
  }

  @Test
  void secondDaemon_onTheSameSocket_isRefused() throws Exception {
    DaemonProcess daemon = DaemonProcess.start();
    try {
      Object[] result = runMain("--socket", daemon.dir().resolve("gpumemd.sock").toString(),
          "--listen", "none", "--metrics-port", "0", "--backend", "host",
          "--shm-dir", daemon.dir().resolve("other-shm").toString());
      assertEquals(1, result[0]);
      assertTrue(((String) result[1]).contains("is in use by a running process"), (String) result[1]);
      try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
        client.lease(0, 512).close(); // the first daemon is unharmed
      }
    } catch (StatusRuntimeException e) {
      throw new AssertionError(daemon.output(), e);
    } finally {
      daemon.close();
    }
  }
}
