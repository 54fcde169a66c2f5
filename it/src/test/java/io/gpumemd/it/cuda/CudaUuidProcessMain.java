package io.gpumemd.it.cuda;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;

/**
 * A Java client process for {@link CudaMigUuidTest}: leases on the daemon's device {@code
 * args[1]} and prints this process's ordinal of it ({@code local=N}), which the client finds by
 * the device's UUID, or {@code error=<message without spaces>}.
 */
public final class CudaUuidProcessMain {
  private CudaUuidProcessMain() {}

  public static void main(String[] args) {
    try (GpuMemClient client = GpuMemClient.connect(args[0])) {
      Lease lease = client.lease(Integer.parseInt(args[1]), 1 << 20);
      try {
        System.out.println("RESULT local=" + CudaLeases.localDevice(lease));
      } catch (RuntimeException e) {
        System.out.println("RESULT error=" + String.valueOf(e.getMessage()).replace(' ', '_'));
      } finally {
        lease.close();
      }
    }
  }
}
