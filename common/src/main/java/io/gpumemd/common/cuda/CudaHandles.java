package io.gpumemd.common.cuda;

import java.lang.reflect.Field;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUipcEventHandle;
import jcuda.driver.CUipcMemHandle;

/**
 * The one place that reaches into JCuda's internals. CUDA IPC handles cross the process
 * boundary as their 64 raw bytes, which JCuda keeps in a private {@code reserved} field with no
 * accessor; and a device pointer's address, which JCuda keeps protected, is what a client adds
 * a lease's offset to; and the POSIX descriptor a VMM import takes as a pointer value. Loaded only by code that handles CUDA memory, so callers without JCuda
 * on the class path never touch it. Stateless and thread-safe.
 */
public final class CudaHandles {
  /** Bytes of a CUDA IPC memory or event handle. */
  public static final int IPC_HANDLE_BYTES = 64;

  private static final Field MEM_RESERVED = reserved(CUipcMemHandle.class);
  private static final Field EVENT_RESERVED = reserved(CUipcEventHandle.class);

  private CudaHandles() {}

  private static Field reserved(Class<?> type) {
    try {
      Field f = type.getDeclaredField("reserved");
      f.setAccessible(true);
      return f;
    } catch (ReflectiveOperationException e) {
      throw new ExceptionInInitializerError(e);
    }
  }

  /** A copy of a memory handle's 64 bytes. */
  public static byte[] bytes(CUipcMemHandle handle) {
    return ((byte[]) get(MEM_RESERVED, handle)).clone();
  }

  /** A copy of an event handle's 64 bytes. */
  public static byte[] bytes(CUipcEventHandle handle) {
    return ((byte[]) get(EVENT_RESERVED, handle)).clone();
  }

  /** A memory handle holding a copy of {@code bytes} (64 of them). */
  public static CUipcMemHandle memHandle(byte[] bytes) {
    CUipcMemHandle handle = new CUipcMemHandle();
    set(MEM_RESERVED, handle, checkLength(bytes));
    return handle;
  }

  /** An event handle holding a copy of {@code bytes} (64 of them). */
  public static CUipcEventHandle eventHandle(byte[] bytes) {
    CUipcEventHandle handle = new CUipcEventHandle();
    set(EVENT_RESERVED, handle, checkLength(bytes));
    return handle;
  }

  /** The device address a pointer holds (its base plus any byte offset). */
  public static long address(CUdeviceptr pointer) {
    return new Address(pointer).value();
  }

  /**
   * The {@code osHandle} argument of {@code cuMemImportFromShareableHandle} for a POSIX file
   * descriptor: the number itself as the pointer's value ({@code (void *)(uintptr_t) fd}), as
   * CUDA's own samples and {@code vmm_reference.py} pass it. Not {@code Pointer.to(new int[]
   * {fd})}: JCuda hands the driver a Pointer's native address plus its byte offset, which for a
   * Java array is 0, so the driver would import descriptor 0.
   */
  public static Pointer osHandle(int fd) {
    if (fd < 0) {
      throw new IllegalArgumentException("descriptor: " + fd + " (expected: >= 0)");
    }
    return new Pointer().withByteOffset(fd);
  }

  /** The value a pointer hands the driver (its native address plus its byte offset). */
  public static long value(Pointer pointer) {
    return new PointerValue(pointer).value();
  }

  private static byte[] checkLength(byte[] bytes) {
    if (bytes.length != IPC_HANDLE_BYTES) {
      throw new IllegalArgumentException("CUDA IPC handle: " + bytes.length + " bytes (expected: "
          + IPC_HANDLE_BYTES + ")");
    }
    return bytes.clone();
  }

  private static Object get(Field field, Object handle) {
    try {
      return field.get(handle);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException("cannot read " + field, e);
    }
  }

  private static void set(Field field, Object handle, byte[] bytes) {
    try {
      field.set(handle, bytes);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException("cannot write " + field, e);
    }
  }

  /** A copy of a pointer whose protected address getters a subclass may call. */
  private static final class Address extends CUdeviceptr {
    Address(CUdeviceptr pointer) {
      super(pointer);
    }

    long value() {
      return getNativePointer() + getByteOffset();
    }
  }

  /** A copy of a pointer whose protected getters a subclass may call. */
  private static final class PointerValue extends Pointer {
    PointerValue(Pointer pointer) {
      super(pointer);
    }

    long value() {
      return getNativePointer() + getByteOffset();
    }
  }
}
