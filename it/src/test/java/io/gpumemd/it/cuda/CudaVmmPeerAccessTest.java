package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Which devices a VMM lease's mapping lets in (issue 33 item 6): the lease's own device, and
 * every device of the process that {@code cuDeviceCanAccessPeer} says can reach it, with the
 * lease's access, as a legacy handle opened with {@code CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS}
 * lets peers in. Read with {@code cuMemGetAccess} for each device, in a client process on the
 * stand-in (no peers: only the own device) and on {@link StandInVariant#peers} (both devices;
 * before, the own device only). A kernel on the peer reaching the memory is for a real machine
 * with two GPUs.
 */
class CudaVmmPeerAccessTest {
  private Path dir;
  private Path peers;

  @BeforeEach
  void setUp() throws Exception {
    CudaAvailability.assumeUsable();
    int[] count = new int[1];
    jcuda.driver.JCudaDriver.cuDeviceGetCount(count);
    Assumptions.assumeTrue(count[0] >= 2, "needs two devices (CUDA_STANDIN_DEVICES=2)");
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-peers-");
    peers = Files.createDirectory(dir.resolve("driver"));
  }

  @AfterEach
  void cleanUp() throws Exception {
    if (dir != null) {
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  private static Map<String, String> client(DaemonProcess daemon, String device, Path driver) throws Exception {
    List<String> command = DaemonProcess.javaCommand(CudaAccessProcessMain.class.getName());
    command.add(daemon.unixTarget());
    command.add(device);
    ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true);
    if (driver != null) {
      builder.environment().put("LD_LIBRARY_PATH", driver.toString());
    }
    return ResultProcess.parse(builder.start());
  }

  @Test
  void vmmMapping_letsInTheLeasesDevice_andItsPeers_withTheLeasesAccess() throws Exception {
    String why = StandInVariant.peers(peers);
    Assumptions.assumeTrue(why == null, "peer driver not built: " + why);
    try (DaemonProcess daemon = DaemonProcess.startIn(dir, "--backend", "cuda", "--cuda-handles", "vmm",
        "--device-limit-bytes", "64MiB")) {
      // The stand-in: no device is another's peer, so only the lease's own device gets in.
      Map<String, String> alone = client(daemon, "1", null);
      assertEquals("1", alone.get("local"), alone.get("output"));
      assertEquals("0", alone.get("access0"), alone.get("output"));
      assertEquals("3", alone.get("access1"), alone.get("output"));
      // Every device a peer of every other: the other device gets the same read-write access.
      Map<String, String> peered = client(daemon, "1", peers);
      assertEquals("3", peered.get("access0"), peered.get("output"));
      assertEquals("3", peered.get("access1"), peered.get("output"));
      Map<String, String> first = client(daemon, "0", peers);
      assertEquals("3", first.get("access0"), first.get("output"));
      assertEquals("3", first.get("access1"), first.get("output"));
    }
  }
}
