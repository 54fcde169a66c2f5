package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import io.gpumemd.server.testing.TestChannel;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.GetStatsRequest;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Sharing on a real GPU: a producer process fills a block on the device, shares it one-shot
 * and exits; a consumer process attaches with the token (opening the segment's IPC handle
 * itself) and reads the producer's bytes back, at the same segment and offset. The block is
 * leased until the consumer releases its hold. Skipped, with the reason, where no GPU is usable.
 */
class SharingCudaTest {
  @BeforeEach
  void needsGpu() {
    CudaAvailability.assumeUsable();
  }

  @Test
  void producerAndConsumerProcesses_seeTheSameDeviceBytes_throughAttach() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "legacy",
        "--device-limit-bytes", "1GiB");
    try (TestChannel channel = new TestChannel(daemon.unixTarget())) {
      assertTrue(daemon.output().contains("Backend: cuda"), daemon.output());
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(channel.channel());
      long size = 2L << 20;
      Map<String, String> produced = ResultProcess.run(SharingCudaMain.class, "produce", daemon.unixTarget(),
          Long.toString(size), "171");
      assertEquals(Long.parseLong(produced.get("block")), leasedBytes(admin),
          "the token holds the block after the producer exited");
      Map<String, String> consumed = ResultProcess.run(SharingCudaMain.class, "consume", daemon.unixTarget(),
          produced.get("token"), Long.toString(size));
      assertEquals("true", consumed.get("attached"));
      assertEquals(produced.get("segment"), consumed.get("segment"));
      assertEquals(produced.get("offset"), consumed.get("offset"));
      assertEquals("171", consumed.get("first"), consumed.get("output"));
      assertEquals("171", consumed.get("last"));
      assertEquals("true", consumed.get("uniform"));
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (leasedBytes(admin) != 0 && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      assertEquals(0, leasedBytes(admin), "the block returned with the consumer's hold");
      assertEquals(0, daemon.terminate(20_000), daemon.output());
    } finally {
      daemon.close();
    }
  }

  private static long leasedBytes(AdminGrpc.AdminBlockingStub admin) {
    return admin.withDeadlineAfter(10, TimeUnit.SECONDS).getStats(GetStatsRequest.newBuilder().setDevice(0).build())
        .getDevices(0).getLeasedBytes();
  }
}
