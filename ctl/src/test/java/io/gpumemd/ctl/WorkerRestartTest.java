package io.gpumemd.ctl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.DaemonProcess;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * {@code gpumemctl worker} keeps going across a daemon restart: the daemon (its own JVM) is
 * SIGKILLed while the worker runs and started again on the same socket; the worker goes on on a
 * new session (its lease call waits for it, or the failed iteration is retried) and finishes
 * every iteration.
 */
class WorkerRestartTest {
  private static final int ITERATIONS = 40;

  @Test
  void workerRetriesAcrossARestart_andFinishesEveryIteration() throws Exception {
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-worker-restart-");
    DaemonProcess daemon = DaemonProcess.startIn(dir);
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    try {
      String target = daemon.unixTarget();
      CompletableFuture<Integer> worker = CompletableFuture.supplyAsync(() -> {
        try (PrintStream o = new PrintStream(out, true, StandardCharsets.UTF_8);
             PrintStream e = new PrintStream(out, true, StandardCharsets.UTF_8)) {
          return GpuMemCtl.run(new String[] {"--target", target, "worker", "--size", "64KiB", "--hold-ms", "50",
              "--iterations", Integer.toString(ITERATIONS)}, o, e, Map.<String, String>of()::get, false);
        }
      });
      // Let it run a few iterations, then take the daemon away without a goodbye.
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
      while (!out.toString(StandardCharsets.UTF_8).contains("iteration 3:") && System.nanoTime() < deadline) {
        Thread.sleep(20);
      }
      assertTrue(out.toString(StandardCharsets.UTF_8).contains("iteration 3:"), out.toString(StandardCharsets.UTF_8));
      daemon.process().destroyForcibly();
      assertTrue(daemon.process().waitFor(10, TimeUnit.SECONDS));
      daemon.close();
      daemon = DaemonProcess.startIn(dir);

      int code = worker.get(90, TimeUnit.SECONDS);
      String log = out.toString(StandardCharsets.UTF_8);
      assertEquals(0, code, log);
      // The iteration that meets the restart either waits in its lease call for the new session
      // or fails and is retried ("; retrying"); either way every iteration completes, the later
      // ones on leases of the new daemon.
      java.util.Set<String> leaseIds = new java.util.HashSet<>();
      java.util.regex.Matcher m = java.util.regex.Pattern.compile("iteration \\d+: lease (\\w+)").matcher(log);
      while (m.find()) {
        leaseIds.add(m.group(1));
      }
      assertTrue(leaseIds.size() >= 2, "leases of the old and of the new daemon: " + leaseIds + "\n" + log);
      assertTrue(log.contains("stopped after " + ITERATIONS + " iteration(s)"), log);
      assertTrue(log.contains("iteration " + ITERATIONS + ":"), log);
    } finally {
      daemon.close();
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }
}
