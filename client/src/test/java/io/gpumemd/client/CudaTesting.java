package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;

import io.gpumemd.server.backend.cuda.JCudaBackend;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import org.junit.jupiter.api.Assumptions;

/**
 * What the client's CUDA tests share: the skip without a usable driver (a GPU, or the stand-in
 * of {@code cuda-standin/}), and synchronous copies to and from a device address of this
 * process, made in the device's primary context.
 */
final class CudaTesting {
  private CudaTesting() {}

  /** Skips the test (class) unless a CUDA driver with at least one device is usable. */
  static void assumeDriver() {
    String why;
    try {
      why = JCudaBackend.probe() > 0 ? null : "the CUDA driver reports no devices";
    } catch (Throwable t) {
      why = "no usable CUDA driver (" + t + ")";
    }
    Assumptions.assumeTrue(why == null, "CUDA tests skipped: " + why);
  }

  static void write(int device, long address, byte[] bytes) {
    CudaContexts.run(device, () -> CudaContexts.check(
        () -> cuMemcpyHtoD(new CUdeviceptr().withByteOffset(address), Pointer.to(bytes), bytes.length), "HtoD"));
  }

  static byte[] read(int device, long address, int length) {
    byte[] bytes = new byte[length];
    CudaContexts.run(device, () -> CudaContexts.check(
        () -> cuMemcpyDtoH(Pointer.to(bytes), new CUdeviceptr().withByteOffset(address), length), "DtoH"));
    return bytes;
  }

  /** The driver's answer to a 4-byte copy from {@code address}: CUDA_SUCCESS when memory is mapped there. */
  static int readResult(int device, long address) {
    byte[] bytes = new byte[4];
    int[] result = new int[1];
    CudaContexts.run(device, () -> result[0] = CudaContexts.result(
        () -> cuMemcpyDtoH(Pointer.to(bytes), new CUdeviceptr().withByteOffset(address), 4), "DtoH"));
    return result[0];
  }
}
