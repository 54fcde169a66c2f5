package io.gpumemd.ctl;

import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.grpc.Status;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUresult;

/**
 * The example worker's pattern on a CUDA lease: written to the device with {@code cuMemcpyHtoD}
 * and read back with {@code cuMemcpyDtoH}, in 4 MiB chunks. Only the worker's CUDA path loads
 * this class (and JCuda). Stateless.
 */
final class CudaPattern {
  private static final int CHUNK = 4 << 20;

  private CudaPattern() {}

  static void writeAndVerify(Lease lease, long seed) {
    CUdeviceptr base = CudaLeases.pointer(lease);
    long size = lease.sizeBytes();
    byte[] host = new byte[(int) Math.min(CHUNK, size)];
    for (long offset = 0; offset < size; offset += CHUNK) {
      int n = (int) Math.min(CHUNK, size - offset);
      for (int i = 0; i < n; i++) {
        host[i] = byteAt(seed, offset + i);
      }
      check(cuMemcpyHtoD(base.withByteOffset(offset), Pointer.to(host), n), "cuMemcpyHtoD");
    }
    for (long offset = 0; offset < size; offset += CHUNK) {
      int n = (int) Math.min(CHUNK, size - offset);
      check(cuMemcpyDtoH(Pointer.to(host), base.withByteOffset(offset), n), "cuMemcpyDtoH");
      for (int i = 0; i < n; i++) {
        if (host[i] != byteAt(seed, offset + i)) {
          throw new GpuMemException(Status.Code.DATA_LOSS, "pattern mismatch at offset " + (offset + i)
              + " of " + lease + ": another holder wrote to this block", null);
        }
      }
    }
  }

  private static byte byteAt(long seed, long offset) {
    long x = seed + (offset >>> 3) * 0xBF58476D1CE4E5B9L;
    return (byte) ((x ^ (x >>> 31)) >>> ((offset & 7) * 8));
  }

  private static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new GpuMemException(Status.Code.INTERNAL, call + " failed: " + CUresult.stringFor(result), null);
    }
  }
}
