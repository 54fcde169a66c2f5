package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemsetD8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.DaemonProcess;
import io.grpc.Status;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import jcuda.Pointer;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * Issue 33 item 1: a closing client hands no block back while its GPU work may still write it.
 * A client process queues a memset on a non-blocking stream over its only block (the daemon's
 * budget holds one), and closes, with the lease closed after that stream or left open, while
 * the memset is still queued (its driver delays stream work past the close's bound). This
 * process then leases the block, the moment the daemon has it again, writes its own bytes and
 * checks, after the other's work would have landed, that they are still there.
 *
 * <p>Runs on the stand-in driver ({@code cuda-standin/}: {@code LD_LIBRARY_PATH} and {@code
 * CUDA_STANDIN_DEVICES=1}), whose {@code CUDA_STANDIN_STREAM_DELAY_MS} makes the queued work
 * land late, and on a GPU (where the delay is absent and the close simply waits for the
 * memset: the test then only shows that the block comes back with it landed).
 */
class CloseWaitsForGpuWorkTest {
  private static final long SIZE = 2L << 20;
  private static final int THEIRS = 171;
  private static final byte OURS = 0x11;
  private static final long DELAY_MS = 1000;
  private static final long BOUND_MS = 300;

  @BeforeAll
  static void needsCuda() {
    CudaTesting.assumeDriver();
  }

  @ParameterizedTest(name = "{0} handles, lease {1}")
  @CsvSource({"vmm,closeAfter", "vmm,open", "legacy,closeAfter", "legacy,open"})
  void blockWithQueuedWork_comesBackOnlyOnceTheWorkLanded(String handles, String how) throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", handles,
        "--device-limit-bytes", Long.toString(SIZE))) {
      assertTrue(daemon.process().isAlive(), "daemon:\n" + daemon.output());
      List<String> command = DaemonProcess.javaCommand(QueuedWorkCloseMain.class.getName());
      command.addAll(List.of(daemon.unixTarget(), Long.toString(SIZE), Integer.toString(THEIRS), how,
          Long.toString(BOUND_MS), Long.toString(DELAY_MS + 1500)));
      ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true);
      builder.environment().put("CUDA_STANDIN_STREAM_DELAY_MS", Long.toString(DELAY_MS));
      Process other = builder.start();
      List<String> lines = Collections.synchronizedList(new ArrayList<>());
      Thread reader = new Thread(() -> {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(other.getInputStream(), StandardCharsets.UTF_8))) {
          for (String line; (line = in.readLine()) != null; ) {
            lines.add(line);
          }
        } catch (Exception e) {
          // ended
        }
      }, "other-client-output");
      reader.setDaemon(true);
      reader.start();
      try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
        String leased = awaitLine(lines, "leased ", 30_000);
        long queuedAt = System.nanoTime();
        Lease lease = leaseWhenFree(client, 30_000);
        long gotAfterMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - queuedAt);
        assertEquals(leased, "leased " + lease.segmentId() + " " + lease.offset(), "the budget holds one block");
        int device = CudaLeases.localDevice(lease);
        CudaContexts.run(device, () -> {
          CudaContexts.check(() -> cuMemsetD8(CudaLeases.pointer(lease), OURS, SIZE), "cuMemsetD8");
          CudaContexts.check(() -> cuCtxSynchronize(), "cuCtxSynchronize");
        });
        Thread.sleep(DELAY_MS + 500); // past the moment the other's memset would land
        byte[] bytes = new byte[(int) SIZE];
        CudaContexts.run(device, () -> CudaContexts.check(
            () -> cuMemcpyDtoH(Pointer.to(bytes), CudaLeases.pointer(lease), SIZE), "cuMemcpyDtoH"));
        int foreign = 0;
        for (byte b : bytes) {
          if (b != OURS) {
            foreign++;
          }
        }
        assertEquals(0, foreign, "bytes of the block overwritten after this process leased it ("
            + gotAfterMs + " ms after the other queued its memset): the other's GPU work landed in it\n"
            + String.join("\n", lines));
        lease.close();
      } finally {
        other.waitFor(DELAY_MS + 10_000, TimeUnit.MILLISECONDS);
        other.destroyForcibly();
      }
      String closed = lines.stream().filter(l -> l.startsWith("closed ")).findFirst().orElse("closed -1");
      assertTrue(Long.parseLong(closed.substring(7)) < DELAY_MS,
          "close returned after its bound, not after the work: " + closed + "\n" + String.join("\n", lines));
      assertTrue(lines.stream().anyMatch(l -> l.contains("still running after") && l.contains("kept")),
          "the other client said it kept the session:\n" + String.join("\n", lines));
    }
  }

  /** Leases the one block as soon as the daemon has it back. */
  private static Lease leaseWhenFree(GpuMemClient client, long millis) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    while (true) {
      try {
        return client.lease(0, SIZE);
      } catch (GpuMemException e) {
        if (e.code() != Status.Code.RESOURCE_EXHAUSTED || System.nanoTime() > deadline) {
          throw e;
        }
        Thread.sleep(10);
      }
    }
  }

  private static String awaitLine(List<String> lines, String prefix, long millis) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    while (System.nanoTime() < deadline) {
      synchronized (lines) {
        for (String line : lines) {
          if (line.startsWith(prefix)) {
            return line;
          }
        }
      }
      Thread.sleep(10);
    }
    throw new AssertionError("no line '" + prefix + "...' from the other client:\n" + String.join("\n", lines));
  }
}
