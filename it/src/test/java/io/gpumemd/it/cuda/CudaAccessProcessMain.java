package io.gpumemd.it.cuda;

import com.sun.jna.Function;
import com.sun.jna.Memory;
import com.sun.jna.NativeLibrary;
import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.common.cuda.CudaHandles;

/**
 * A Java client process for {@link CudaVmmPeerAccessTest}: leases on the daemon's device {@code
 * args[1]}, and prints the access each device of this process has to the lease's mapping
 * ({@code cuMemGetAccess}, through JNA as the client sets it): {@code local=N access0=F
 * access1=F …} with F the {@code CU_MEM_ACCESS_FLAGS} (0 none, 1 read, 3 read-write).
 */
public final class CudaAccessProcessMain {
  private CudaAccessProcessMain() {}

  public static void main(String[] args) {
    Function getAccess = NativeLibrary.getInstance("libcuda.so.1").getFunction("cuMemGetAccess");
    try (GpuMemClient client = GpuMemClient.connect(args[0])) {
      Lease lease = client.lease(Integer.parseInt(args[1]), 1 << 20);
      try {
        long pointer = CudaHandles.address(CudaLeases.pointer(lease));
        StringBuilder result = new StringBuilder("RESULT local=" + CudaLeases.localDevice(lease));
        int[] count = new int[1];
        jcuda.driver.JCudaDriver.cuDeviceGetCount(count);
        for (int d = 0; d < count[0]; d++) {
          try (Memory flags = new Memory(Long.BYTES); Memory location = new Memory(8)) {
            flags.setLong(0, -1);
            location.setInt(0, 1); // CU_MEM_LOCATION_TYPE_DEVICE
            location.setInt(4, d);
            int rc = getAccess.invokeInt(new Object[] {flags, location, pointer});
            result.append(" access").append(d).append('=').append(rc == 0 ? Long.toString(flags.getLong(0)) : "error" + rc);
          }
        }
        System.out.println(result);
      } finally {
        lease.close();
      }
    }
  }
}
