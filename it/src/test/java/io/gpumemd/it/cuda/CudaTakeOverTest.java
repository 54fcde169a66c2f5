package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.common.cuda.CudaUuids;
import io.gpumemd.common.cuda.DeviceUuidDriver;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * {@code gpumemd --take-over} on the CUDA backend (VMM handles) with real daemon processes that
 * see the GPUs through different {@code CUDA_VISIBLE_DEVICES} (issue 33 item 4): a successor
 * whose device n is another GPU than the running daemon's device n is refused, naming both
 * UUIDs and ordinals, and the running daemon serves on with its sessions; one that sees the same
 * GPUs in the same order takes over. Those two need two devices: the stand-in driver with {@code
 * CUDA_STANDIN_DEVICES=2}, or a machine with two GPUs. On one device: bytes a producer process
 * wrote into a VMM block and shared by token are read by a consumer process from the successor,
 * so the device memory itself crossed the hand-over (its descriptor, sent ahead, imported by the
 * successor before the old daemon let go).
 */
class CudaTakeOverTest {
  private Path dir;
  private final List<DaemonProcess> daemons = new ArrayList<>();

  @BeforeEach
  void setUp() throws Exception {
    CudaAvailability.assumeUsable();
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-cuda-takeover-");
  }

  private static void assumeTwoDevices() {
    Assumptions.assumeTrue(visibleUuids().size() >= 2, "needs two CUDA devices (CUDA_STANDIN_DEVICES=2 on the "
        + "stand-in); this process sees " + visibleUuids());
  }

  @AfterEach
  void cleanUp() throws Exception {
    daemons.forEach(DaemonProcess::close);
    if (dir != null) {
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  /** The UUIDs of the first two devices this JVM sees, as the daemon reads them. */
  private static List<String> visibleUuids() {
    List<String> uuids = new ArrayList<>();
    for (int d = 0; d < 2; d++) {
      byte[] raw = new byte[CudaUuids.UUID_BYTES];
      if (DeviceUuidDriver.uuid(d, raw) != 0) {
        break;
      }
      uuids.add(CudaUuids.format(raw));
    }
    return uuids;
  }

  /** A VMM daemon in {@link #dir} that sees the devices {@code visible} names, in that order. */
  private DaemonProcess start(String visible, String... extra) {
    List<String> flags = new ArrayList<>(List.of("--backend", "cuda", "--cuda-handles", "vmm",
        "--device-limit-bytes", "256MiB", "--keepalive-grace-ms", "5000"));
    flags.addAll(List.of(extra));
    DaemonProcess d = DaemonProcess.startIn(dir, Map.of("CUDA_VISIBLE_DEVICES", visible),
        flags.toArray(String[]::new));
    daemons.add(d);
    return d;
  }

  @Test
  void successorSeeingTheGpusInAnotherOrder_isRefused_namingBothUuids_andTheDaemonServesOn() throws Exception {
    assumeTwoDevices();
    List<String> uuids = visibleUuids();
    DaemonProcess daemon = start("0,1");
    assertTrue(daemon.process().isAlive(), daemon.output());
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      String session = client.sessionId();
      Lease first = client.lease(0, 2L << 20);
      Lease second = client.lease(1, 2L << 20);

      DaemonProcess successor = start("1,0", "--take-over");
      assertEquals(1, successor.awaitExit(60_000), "the successor must stop:\n" + successor.output());
      String out = successor.output();
      assertTrue(out.contains("take-over refused by the running daemon"), out);
      assertTrue(out.contains("device 0 is " + uuids.get(0) + " here and " + uuids.get(1) + " in the successor "
          + "(which sees " + uuids.get(0) + " as its device 1)"), out);
      assertTrue(out.contains("CUDA_VISIBLE_DEVICES"), out);
      assertTrue(daemon.process().isAlive(), daemon.output());
      assertTrue(daemon.output().contains("refused"), daemon.output());

      // Untouched: the same session leases on both devices, the leases held are still its own.
      Lease more = client.lease(1, 2L << 20);
      more.close();
      assertEquals(session, client.sessionId());
      first.close();
      second.close();
    }
  }

  @Test
  void successorSeeingTheSameGpusInTheSameOrder_takesOver_byUuidEntries() throws Exception {
    assumeTwoDevices();
    List<String> uuids = visibleUuids();
    DaemonProcess daemon = start("0,1");
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      String session = client.sessionId();
      Lease held = client.lease(1, 2L << 20);
      // The same GPUs named by UUID instead of ordinal: the same devices.
      DaemonProcess successor = start(uuids.get(0) + "," + uuids.get(1), "--take-over");
      assertEquals(0, daemon.awaitExit(60_000), "the old daemon must hand over and exit 0:\n" + daemon.output()
          + "\n--- successor:\n" + successor.output());
      assertTrue(successor.process().isAlive(), successor.output());
      assertTrue(successor.output().contains("Took over from pid " + daemon.process().pid()), successor.output());
      Lease more = client.lease(0, 2L << 20);
      more.close();
      held.close();
      assertEquals(session, client.sessionId());
    }
  }

  @Test
  void deviceBytesSharedBeforeATakeOver_areReadFromTheSuccessor_andALiveSessionLeasesOn() throws Exception {
    long size = 2L << 20;
    DaemonProcess daemon = start("0");
    String target = daemon.unixTarget();
    Map<String, String> produced = ResultProcess.run(CudaVmmProcessMain.class, "produce", target,
        Long.toString(size), "171", "false");
    try (GpuMemClient client = GpuMemClient.connect(target)) {
      String session = client.sessionId();
      Lease held = client.lease(0, 64L << 20);
      DaemonProcess successor = start("0", "--take-over");
      assertEquals(0, daemon.awaitExit(60_000), "the old daemon must hand over and exit 0:\n" + daemon.output()
          + "\n--- successor:\n" + successor.output());
      assertTrue(successor.output().contains("Took over from pid " + daemon.process().pid()), successor.output());

      Map<String, String> consumed = ResultProcess.run(CudaVmmProcessMain.class, "consume", target,
          produced.get("token"), Long.toString(size), "false");
      assertEquals(produced.get("segment"), consumed.get("segment"), consumed.get("output"));
      assertEquals("171", consumed.get("first"), consumed.get("output"));
      assertEquals("171", consumed.get("last"), consumed.get("output"));
      assertEquals("true", consumed.get("uniform"), consumed.get("output"));

      Lease more = client.lease(0, size);
      more.close();
      held.close();
      assertEquals(session, client.sessionId());
    }
  }
}
