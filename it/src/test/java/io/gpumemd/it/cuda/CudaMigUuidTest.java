package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import io.gpumemd.common.cuda.CudaUuids;
import io.gpumemd.common.cuda.DeviceUuidDriver;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceInfo;
import io.gpumemd.proto.v1.ListDevicesRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import io.gpumemd.server.testing.TestChannel;
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
 * The daemon and the Java client name a device by {@code cuDeviceGetUuid_v2} (issue 33 item 6),
 * on a driver whose first version answers one parent UUID for two devices, as under MIG ({@link
 * StandInVariant#mig}): the daemon reports each device's own UUID, and a client process finds the
 * daemon's device 1 as its own device 1. With the first version (JCuda's binding), the daemon
 * reported the parent UUID twice and the client matched both devices to its device 0.
 */
class CudaMigUuidTest {
  private Path dir;

  @BeforeEach
  void setUp() throws Exception {
    CudaAvailability.assumeUsable();
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-mig-");
    String why = StandInVariant.mig(dir);
    Assumptions.assumeTrue(why == null, "MIG-like driver not built: " + why);
  }

  @AfterEach
  void cleanUp() throws Exception {
    if (dir != null) {
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  @Test
  void daemonAndClient_nameDevicesByV2_notByTheParentGpu() throws Exception {
    List<String> own = new ArrayList<>();
    for (int d = 0; d < 2; d++) {
      byte[] raw = new byte[CudaUuids.UUID_BYTES];
      if (DeviceUuidDriver.uuid(d, raw) == 0) {
        own.add(CudaUuids.format(raw));
      }
    }
    Assumptions.assumeTrue(own.size() == 2, "needs two devices (CUDA_STANDIN_DEVICES=2)");
    Map<String, String> env = Map.of("LD_LIBRARY_PATH", dir.toString());
    try (DaemonProcess daemon = DaemonProcess.startIn(dir, env, "--backend", "cuda", "--device-limit-bytes", "64MiB")) {
      List<String> reported = new ArrayList<>();
      try (TestChannel channel = new TestChannel(daemon.unixTarget())) {
        for (DeviceInfo d : AdminGrpc.newBlockingStub(channel.channel())
            .listDevices(ListDevicesRequest.getDefaultInstance()).getDevicesList()) {
          reported.add(d.getUuid());
        }
      }
      assertEquals(own, reported, "the daemon's device UUIDs:\n" + daemon.output());
      assertNotEquals(StandInVariant.PARENT_UUID, reported.get(0));

      List<String> command = DaemonProcess.javaCommand(CudaUuidProcessMain.class.getName());
      command.add(daemon.unixTarget());
      command.add("1");
      ProcessBuilder client = new ProcessBuilder(command).redirectErrorStream(true);
      client.environment().put("LD_LIBRARY_PATH", dir.toString());
      Map<String, String> result = ResultProcess.parse(client.start());
      assertEquals("1", result.get("local"), result.get("output"));
    }
  }
}
