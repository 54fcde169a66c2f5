package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import io.grpc.Status;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A daemon out of file descriptors while it exports a VMM segment for a client (issue 33 item
 * 6): the driver says {@code CUDA_ERROR_OUT_OF_MEMORY} (it documents no error for a full
 * descriptor table), and the daemon, finding it cannot open a descriptor either, refuses the
 * mapping {@code RESOURCE_EXHAUSTED} naming its RLIMIT_NOFILE, not INTERNAL; it leaks nothing,
 * and serves the same request once descriptors are free again. The limit is lowered on the live
 * daemon with {@code prlimit} (its soft limit, to exactly the descriptors it has open).
 */
class CudaVmmDescriptorLimitTest {
  private static final long MiB = 1L << 20;

  @BeforeEach
  void needsGpu() {
    CudaAvailability.assumeUsable();
  }

  @Test
  void exportWithNoDescriptorLeft_isResourceExhausted_namingTheLimit_andServedOnceOneIsFree() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "vmm",
        "--device-limit-bytes", "256MiB");
         GpuMemClient first = GpuMemClient.connect(daemon.unixTarget());
         GpuMemClient second = GpuMemClient.connect(daemon.unixTarget())) {
      long pid = daemon.process().pid();
      // Both clients' connections (gRPC and fd channel) are open before the limit: one lease
      // each, mapped. The first holds a block of a small-pool segment (at least 2 MiB) that the
      // second then leases from without a new allocation: only the export needs a descriptor.
      Lease held = first.lease(0, MiB);
      assertNotNull(CudaLeases.pointer(held));
      Lease warm = second.lease(1 % deviceCount(), MiB);
      assertNotNull(CudaLeases.pointer(warm));

      String soft = softLimit(pid);
      int open = openDescriptors(pid);
      prlimit(pid, Integer.toString(open));
      GpuMemException refused;
      try {
        refused = org.junit.jupiter.api.Assertions.assertThrows(GpuMemException.class, () -> {
          Lease blocked = second.lease(0, 512 * 1024);
          try {
            CudaLeases.pointer(blocked);
          } finally {
            blocked.close();
          }
        });
      } finally {
        prlimit(pid, soft);
      }
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, refused.code(), refused.toString());
      assertTrue(refused.getMessage().contains("RLIMIT_NOFILE"), refused.getMessage());
      assertTrue(daemon.output().contains("CUDA_ERROR_OUT_OF_MEMORY") || !daemon.output().contains("Unexpected"),
          daemon.output());
      assertTrue(openDescriptors(pid) <= open, "the daemon holds " + openDescriptors(pid) + " descriptors, "
          + open + " before the failed export");

      // Descriptors free again: the same lease maps.
      Lease again = second.lease(0, 512 * 1024);
      assertNotNull(CudaLeases.pointer(again));
      again.close();
      warm.close();
      held.close();
      assertTrue(daemon.process().isAlive(), daemon.output());
    }
  }

  /** How many devices the daemon serves: it sees what this JVM sees. */
  private static int deviceCount() throws Exception {
    jcuda.driver.JCudaDriver.cuInit(0);
    int[] count = new int[1];
    jcuda.driver.JCudaDriver.cuDeviceGetCount(count);
    return count[0];
  }

  private static int openDescriptors(long pid) throws Exception {
    try (var list = Files.list(Path.of("/proc/" + pid + "/fd"))) {
      return (int) list.count();
    }
  }

  /** The process's soft RLIMIT_NOFILE, from /proc/PID/limits. */
  private static String softLimit(long pid) throws Exception {
    for (String line : Files.readAllLines(Path.of("/proc/" + pid + "/limits"))) {
      if (line.startsWith("Max open files")) {
        return line.substring("Max open files".length()).trim().split("\\s+")[0];
      }
    }
    throw new AssertionError("no 'Max open files' in /proc/" + pid + "/limits");
  }

  /** Sets the soft limit only: the hard one stays, so it can be raised again without privilege. */
  private static void prlimit(long pid, String soft) throws Exception {
    Process p = new ProcessBuilder("prlimit", "--pid", Long.toString(pid), "--nofile=" + soft + ":")
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertTrue(p.waitFor(10, TimeUnit.SECONDS) && p.exitValue() == 0, "prlimit: " + out);
  }
}
