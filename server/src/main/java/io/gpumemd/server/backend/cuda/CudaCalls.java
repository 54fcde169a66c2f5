package io.gpumemd.server.backend.cuda;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import jcuda.driver.CUresult;

/**
 * Result checking for JCuda driver calls. JCuda's exceptions are turned off; every call's
 * result goes through {@link #check}, which names the call and the CUDA error. (Handle bytes
 * and addresses are {@code io.gpumemd.common.cuda.CudaHandles}'s.) Stateless and thread-safe.
 */
final class CudaCalls {
  private CudaCalls() {}

  /** Throws a {@link BackendException} naming the call unless {@code result} is success. */
  static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      String message = call + " failed: " + CUresult.stringFor(result);
      if (result == CUresult.CUDA_ERROR_OUT_OF_MEMORY) {
        throw new BackendOutOfMemoryException(message);
      }
      throw new BackendException(message);
    }
  }
}
