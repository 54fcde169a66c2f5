package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import io.grpc.Status;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Real device memory shared across processes: process A fills a leased block on the GPU and
 * releases it with an IPC event; process B leases the same size, gets a pool hit on the same
 * segment, and reads A's bytes back. Against a small {@code --device-limit-bytes}, a lease the
 * budget cannot hold is RESOURCE_EXHAUSTED naming what was asked, what is leased and the limit,
 * counted as an OOM, and leasing works again once a block is given back. The daemon runs with
 * legacy handles ({@code --cuda-handles legacy}), the path this test's IPC client takes. Skipped,
 * with the reason, where no GPU is usable.
 */
class CudaIpcTest {
  @BeforeEach
  void needsGpu() {
    CudaAvailability.assumeUsable();
  }

  private static Map<String, String> run(String... args) throws Exception {
    return ResultProcess.run(CudaIpcProcessMain.class, args);
  }


  @Test
  void blockFilledByOneProcess_isReadByAnother_afterItsEvent() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "legacy",
        "--device-limit-bytes", "1GiB");
    try {
      assertTrue(daemon.output().contains("Backend: cuda"), daemon.output());
      long size = 2L << 20;
      Map<String, String> a = run("write", daemon.unixTarget(), Long.toString(size), "90");
      Map<String, String> b = run("read", daemon.unixTarget(), Long.toString(size));
      assertEquals("false", a.get("hit"));
      assertEquals("true", b.get("hit"));
      assertEquals(a.get("segment"), b.get("segment"));
      assertEquals(a.get("offset"), b.get("offset"));
      assertEquals("90", b.get("first"));
      assertEquals("90", b.get("last"));
      assertEquals("true", b.get("uniform"));
      assertEquals(0, daemon.terminate(20_000), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void smallLimit_refusesWithResourceExhausted_countsTheOom_andLeasesAgainAfterARelease() throws Exception {
    long limit = 64L << 20;
    long size = 8L << 20;
    DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "legacy",
        "--device-limit-bytes", "64MiB");
    // No client cache: a closed lease goes back to the daemon, not into this process's cache.
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName("cuda-oom").clientCacheBytes(0)
        .connect()) {
      assertTrue(daemon.output().contains("Backend: cuda"), daemon.output());
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(client.connection().channel());
      long oomsBefore = ooms(admin);
      List<Lease> held = new ArrayList<>();
      GpuMemException refused = null;
      for (int i = 0; i < 64 && refused == null; i++) { // 64 x 8 MiB: eight times the limit
        try {
          held.add(client.lease(0, size));
        } catch (GpuMemException e) {
          refused = e;
        }
      }
      assertNotNull(refused, held.size() + " leases of 8 MiB under a 64 MiB limit, none refused");
      String message = refused.getMessage();
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, refused.code(), message);
      assertTrue(Pattern.compile("requested=\\d+").matcher(message).find(), message);
      assertTrue(Pattern.compile("leased=\\d+").matcher(message).find(), message);
      assertTrue(message.contains("limit=" + limit), message);
      assertFalse(held.isEmpty(), "the first lease was refused: " + message);
      assertTrue(held.size() * size <= limit, held.size() + " leases of " + size + " under a limit of " + limit);
      assertTrue(ooms(admin) > oomsBefore, "the refusal is counted in ooms");

      held.remove(held.size() - 1).close();
      // The release reaches the daemon asynchronously and its block waits for its IPC event: a
      // lease may be refused a short while; it must succeed within a bounded time.
      Lease again = null;
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
      while (again == null) {
        try {
          again = client.lease(0, size);
        } catch (GpuMemException e) {
          assertEquals(Status.Code.RESOURCE_EXHAUSTED, e.code(), e.getMessage());
          assertTrue(System.nanoTime() < deadline, "no lease after a release: " + e.getMessage());
          Thread.sleep(50);
        }
      }
      assertEquals(size, again.sizeBytes());
      again.close();
      held.forEach(Lease::close);
    } finally {
      daemon.close();
    }
  }

  private static long ooms(AdminGrpc.AdminBlockingStub admin) {
    return admin.getStats(GetStatsRequest.newBuilder().setDevice(0).build()).getDevices(0).getOoms();
  }
}
