package io.gpumemd.server.backend.cuda;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import java.lang.reflect.Field;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUipcEventHandle;
import jcuda.driver.CUipcMemHandle;
import jcuda.driver.CUresult;

/**
 * Result checking and handle plumbing for JCuda driver calls. JCuda's exceptions are turned
 * off; every call's result goes through {@link #check}, which names the call and the CUDA
 * error. Stateless and thread-safe.
 */
final class CudaCalls {
  static final int IPC_HANDLE_BYTES = 64;
  private static final Field MEM_RESERVED = field(CUipcMemHandle.class);
  private static final Field EVENT_RESERVED = field(CUipcEventHandle.class);

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

  // JCuda keeps the 64 handle bytes in a private field with no accessor; the bytes are what
  // crosses the process boundary, so we read and write the field directly.
  private static Field field(Class<?> type) {
    try {
      Field f = type.getDeclaredField("reserved");
      f.setAccessible(true);
      return f;
    } catch (ReflectiveOperationException e) {
      throw new ExceptionInInitializerError(e);
    }
  }

  static byte[] bytesOf(CUipcMemHandle handle) {
    try {
      return ((byte[]) MEM_RESERVED.get(handle)).clone();
    } catch (IllegalAccessException e) {
      throw new BackendException("cannot read CUipcMemHandle bytes", e);
    }
  }

  static CUipcEventHandle eventHandle(byte[] bytes) {
    CUipcEventHandle handle = new CUipcEventHandle();
    try {
      EVENT_RESERVED.set(handle, bytes.clone());
    } catch (IllegalAccessException e) {
      throw new BackendException("cannot write CUipcEventHandle bytes", e);
    }
    return handle;
  }

  /** A device pointer whose address can be read (JCuda keeps it protected). */
  static final class Address extends CUdeviceptr {
    long value() {
      return getNativePointer();
    }
  }
}
