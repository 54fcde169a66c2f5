package io.gpumemd.it.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemsetD8Async;
import static jcuda.driver.JCudaDriver.cuStreamCreate;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import jcuda.Pointer;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;

/**
 * A CUDA worker process for {@link CudaIpcTest}. {@code write TARGET SIZE VALUE}: leases a block,
 * fills it on the device with {@code cuMemsetD8Async} on its own stream, and releases it after
 * an event recorded after the fill (the client sends the release once the event completed). {@code read TARGET SIZE}: leases a block of the same size
 * and copies it back to the host. Both print one line:
 * {@code RESULT segment=<id> offset=<n> hit=<bool> [first=<byte> last=<byte> uniform=<bool>]}.
 */
public final class CudaIpcProcessMain {
  private CudaIpcProcessMain() {}

  public static void main(String[] args) {
    String mode = args[0];
    long size = Long.parseLong(args[2]);
    try (GpuMemClient client = GpuMemClient.builder(args[1]).clientName("cuda-" + mode).connect()) {
      Lease lease = client.lease(0, size);
      check(cuCtxSetCurrent(CudaLeases.context(lease)), "cuCtxSetCurrent"); // the client leaves it to us
      StringBuilder out = new StringBuilder("RESULT segment=" + lease.segmentId() + " offset="
          + lease.offset() + " hit=" + lease.poolHit());
      if (mode.equals("write")) {
        byte value = (byte) Integer.parseInt(args[3]);
        CUstream stream = new CUstream();
        check(cuStreamCreate(stream, 0), "cuStreamCreate");
        check(cuMemsetD8Async(CudaLeases.pointer(lease), value, size, stream), "cuMemsetD8Async");
        CudaLeases.closeAfter(lease, stream);
      } else {
        byte[] host = new byte[(int) size];
        check(cuMemcpyDtoH(Pointer.to(host), CudaLeases.pointer(lease), size), "cuMemcpyDtoH");
        boolean uniform = true;
        for (byte b : host) {
          uniform &= b == host[0];
        }
        out.append(" first=").append(host[0] & 0xff).append(" last=").append(host[host.length - 1] & 0xff)
            .append(" uniform=").append(uniform);
        lease.close();
      }
      System.out.println(out);
    }
  }

  private static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new IllegalStateException(call + ": " + CUresult.stringFor(result));
    }
  }
}
