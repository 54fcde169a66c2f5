package io.gpumemd.ctl;

import static jcuda.driver.JCudaDriver.cuCtxPopCurrent;
import static jcuda.driver.JCudaDriver.cuCtxPushCurrent;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.Arrays;
import jcuda.Pointer;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUresult;

/**
 * The example worker's pattern on a CUDA lease (the same bytes as on a host lease): built on
 * the host a 64-bit word at a time,
 * written to the device with one {@code cuMemcpyHtoD} and read back with one {@code
 * cuMemcpyDtoH} (per 256 MiB), and compared with {@link Arrays#mismatch}. Only the worker's
 * CUDA path loads this class (and JCuda). Stateless.
 */
final class CudaPattern {
  /** Most bytes copied at once: one copy each way for any lease up to this size. */
  private static final int CHUNK = 256 << 20;

  private CudaPattern() {}

  static void writeAndVerify(Lease lease, long seed) {
    // The client never changes the thread's context: the copies run in the lease's, pushed here.
    check(cuCtxPushCurrent(CudaLeases.context(lease)), "cuCtxPushCurrent");
    try {
      copyAndCompare(lease, seed);
    } finally {
      check(cuCtxPopCurrent(new CUcontext()), "cuCtxPopCurrent");
    }
  }

  private static void copyAndCompare(Lease lease, long seed) {
    CUdeviceptr base = CudaLeases.pointer(lease);
    long size = lease.sizeBytes();
    for (long offset = 0; offset < size; offset += CHUNK) {
      int n = (int) Math.min(CHUNK, size - offset);
      byte[] expected = pattern(seed, offset, n);
      check(cuMemcpyHtoD(base.withByteOffset(offset), Pointer.to(expected), n), "cuMemcpyHtoD");
      byte[] back = new byte[n];
      check(cuMemcpyDtoH(Pointer.to(back), base.withByteOffset(offset), n), "cuMemcpyDtoH");
      int at = Arrays.mismatch(expected, back);
      if (at >= 0) {
        throw new GpuMemException(Status.Code.DATA_LOSS, "pattern mismatch at offset " + (offset + at)
            + " of " + lease + ": another holder wrote to this block", null);
      }
    }
  }

  /** {@code n} bytes of the pattern from {@code offset} (a multiple of 8). */
  static byte[] pattern(long seed, long offset, int n) {
    byte[] bytes = new byte[n];
    LongBuffer words = ByteBuffer.wrap(bytes).order(ByteOrder.BIG_ENDIAN).asLongBuffer();
    long first = offset >>> 3;
    for (int w = 0; w < n / 8; w++) {
      words.put(w, Worker.patternAt(seed, first + w));
    }
    for (int i = n & ~7; i < n; i++) {
      bytes[i] = (byte) seed; // the tail past the last whole word, as the host worker writes it
    }
    return bytes;
  }

  private static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new GpuMemException(Status.Code.INTERNAL, call + " failed: " + CUresult.stringFor(result), null);
    }
  }
}
