package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.LogCapture;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * A client survives daemon restarts (SIGTERM and SIGKILL, on the same socket and shm-dir): its
 * live leases die clearly with the old session, and the next lease opens a new session whose
 * memory is the new daemon's, even though the restarted daemon reuses segment ids.
 */
class DaemonRestartTest {
  private static final int RESTARTS = 3;
  private static final long SIZE = 300_000;

  @Test
  void clientOpensNewSessionAfterEachRestart_oldLeasesFailClearly() throws Exception {
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-restart-");
    // path segments: the test reads a lease's file to tell whose memory it is
    DaemonProcess daemon = DaemonProcess.startIn(dir, "--host-segments", "path");
    try (LogCapture log = new LogCapture(GpuMemClient.class);
         GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      Set<String> sessions = new HashSet<>();
      sessions.add(client.sessionId());
      List<Lease> dead = new ArrayList<>();
      Lease live = client.lease(0, SIZE);
      fill(live.buffer(), (byte) 0x40);
      client.lease(0, SIZE / 2).close(); // into the client cache tier of the first session
      for (int round = 1; round <= RESTARTS; round++) {
        String before = client.sessionId();
        if (round % 2 == 1) {
          daemon.terminate(10_000); // SIGTERM: the daemon drains (the live lease is not given back), then exits
        } else {
          daemon.process().destroyForcibly(); // SIGKILL: no goodbye at all
          assertTrue(daemon.process().waitFor(10, TimeUnit.SECONDS));
        }
        daemon.close();
        daemon = DaemonProcess.startIn(dir, "--host-segments", "path");

        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!live.isLost() && System.nanoTime() < deadline) {
          Thread.sleep(20);
        }
        assertTrue(live.isLost(), "round " + round + ": the old session is not seen lost");
        Lease old = live;
        IllegalStateException error = assertThrows(IllegalStateException.class, old::buffer);
        assertTrue(error.getMessage().contains("session lost"), error.getMessage());

        Lease next = client.lease(0, SIZE);
        assertFalse(next.localHit(), "a block cached by the old session served a lease");
        assertNotEquals(before, client.sessionId());
        assertTrue(sessions.add(client.sessionId()), "a session id came back");
        assertFalse(client.sessionLost());
        byte value = (byte) (0x40 + round);
        fill(next.buffer(), value);

        // Closing the old lease is harmless, and touches nothing of the new session (the same
        // segment id now names a segment of the new daemon).
        old.close();
        old.close();
        assertEquals(1, client.mappedSegments());
        for (Lease d : dead) {
          d.close();
        }
        assertEquals(value, next.buffer().get((int) SIZE - 1));
        // What an operator reads: one WARN for the loss, one INFO naming both sessions.
        String after = client.sessionId();
        assertEquals(1, log.messages("WARN").stream().filter(m -> m.startsWith("gpumemd session " + before + " lost")).count(),
            log.messages("WARN").toString());
        assertEquals(1, log.messages("INFO").stream().filter(m -> m.contains(before + " lost; opened new session " + after))
            .count(), log.messages("INFO").toString());
        // The bytes are in the new daemon's segment file, where it says the block is.
        assertFile(next, value);
        dead.add(old);
        live = next;
      }
      live.close();
      Lease after = client.lease(1, 4096);
      after.buffer().put(0, (byte) 7);
      assertEquals(7, after.buffer().get(0));
      after.close();
    } finally {
      daemon.close();
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  /**
   * A lease asked for while the daemon is away (its stream broken, the session not yet seen
   * lost) waits for the restart instead of failing at once: a caller that retries on
   * UNAVAILABLE, as a worker does, needs a few attempts across a restart, not thousands.
   */
  @Test
  void leaseWhileTheDaemonIsAway_waitsForItsRestart_insteadOfFailingAtOnce() throws Exception {
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-restart-");
    DaemonProcess daemon = DaemonProcess.startIn(dir, "--host-segments", "path", "--keepalive-grace-ms", "1000");
    java.util.concurrent.CompletableFuture<DaemonProcess> next = null;
    // No client cache: a closed block kept by the client would serve the lease locally.
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      client.lease(0, SIZE).close();
      String before = client.sessionId();
      daemon.process().destroyForcibly(); // SIGKILL
      assertTrue(daemon.process().waitFor(10, TimeUnit.SECONDS));
      daemon.close();
      Thread.sleep(100); // the client sees its stream break and starts reattaching
      next = java.util.concurrent.CompletableFuture.supplyAsync(() -> DaemonProcess.startIn(dir, "--host-segments", "path", "--keepalive-grace-ms", "1000"));
      int attempts = 0;
      List<String> failures = new ArrayList<>();
      Lease lease = null;
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (lease == null && System.nanoTime() < deadline) {
        attempts++;
        try {
          lease = client.lease(0, SIZE);
        } catch (io.gpumemd.client.GpuMemException e) {
          assertEquals(io.grpc.Status.Code.UNAVAILABLE, e.code(), e.getMessage());
          if (failures.size() < 10) {
            failures.add(e.getMessage());
          }
        }
      }
      assertNotNull(lease, "no lease after the restart: " + failures);
      assertTrue(attempts <= 3, attempts + " attempts across one restart: " + failures);
      assertNotEquals(before, client.sessionId());
      fill(lease.buffer(), (byte) 0x5A);
      daemon = next.get(60, TimeUnit.SECONDS);
      assertFile(lease, (byte) 0x5A);
      lease.close();
    } finally {
      if (next != null) { // a failure may leave the new daemon starting: stop it before the directory goes
        try {
          next.get(60, TimeUnit.SECONDS).close();
        } catch (Exception e) {
          // it did not start
        }
      }
      daemon.close();
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  private static void fill(ByteBuffer buffer, byte value) {
    for (int i = 0; i < buffer.capacity(); i++) {
      buffer.put(i, value);
    }
  }

  /** Reads the lease's bytes through the daemon's file, not through the client's mapping. */
  private static void assertFile(Lease lease, byte value) throws Exception {
    ByteBuffer read = ByteBuffer.allocate((int) lease.sizeBytes());
    try (FileChannel file = FileChannel.open(Path.of(lease.hostShmPath()), StandardOpenOption.READ)) {
      while (read.hasRemaining()) {
        if (file.read(read, lease.offset() + read.position()) < 0) {
          break;
        }
      }
    }
    for (int i = 0; i < read.capacity(); i++) {
      if (read.get(i) != value) {
        throw new AssertionError("byte " + i + " of " + lease + " in " + lease.hostShmPath() + ": " + read.get(i));
      }
    }
  }
}
