package io.gpumemd.server.books;

import io.gpumemd.common.Sizes;
import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.pool.DevicePool;

/**
 * Checks of request fields, in one place, so that every rpc rejects the same input with the
 * same {@code name: value (expected: …)} message. Stateless and thread-safe.
 */
public final class Validation {
  /** Longest {@code client_name} and {@code tag} accepted. */
  public static final int MAX_LABEL_LENGTH = 128;

  private Validation() {}

  /**
   * A lease size: positive and within the device's budget. A larger lease could never be
   * served (the budget bounds everything the pool holds), so it is a bad request, not an
   * exhausted pool.
   */
  public static long leaseSize(long size, DevicePool pool) {
    if (size <= 0) {
      throw InvalidRequestException.of("size_bytes", size, "> 0");
    }
    long budget = pool.limitBytes();
    if (size > budget) {
      throw InvalidRequestException.of("size_bytes", size,
          "at most " + budget + ", the budget of device " + pool.device().ordinal()
              + " (" + Sizes.format(budget) + ")");
    }
    // The segment is rounded up to the backend's granularity: a request under the budget whose
    // segment is over it would ask every holder to give memory back, wait, and fail anyway.
    long segment = pool.segmentBytesFor(size);
    if (segment > budget) {
      throw InvalidRequestException.of("size_bytes", size,
          "a size whose segment fits the budget of device " + pool.device().ordinal() + " (" + Sizes.format(budget)
              + "); this one needs a segment of " + segment + " bytes, whole multiples of the device's "
              + Sizes.format(pool.segmentGranularity()) + " granularity");
    }
    return size;
  }

  /** A free-form label ({@code client_name}, {@code tag}): bounded, printable. */
  public static String label(String field, String value) {
    if (value.length() > MAX_LABEL_LENGTH) {
      throw InvalidRequestException.of(field, value.length() + " characters",
          "at most " + MAX_LABEL_LENGTH);
    }
    for (int i = 0; i < value.length(); i++) {
      if (Character.isISOControl(value.charAt(i))) {
        throw InvalidRequestException.of(field, "a control character at index " + i,
            "printable text");
      }
    }
    return value;
  }

  /** A non-negative byte count such as {@code keep_bytes} or {@code cap_bytes}. */
  public static long byteCount(String field, long value) {
    if (value < 0) {
      throw InvalidRequestException.of(field, value, ">= 0");
    }
    return value;
  }

  /** An optional CUDA IPC event handle: empty or exactly 64 bytes. */
  public static byte[] eventHandle(byte[] handle) {
    if (handle.length != 0 && handle.length != CudaHandles.IPC_HANDLE_BYTES) {
      throw InvalidRequestException.of("cuda_ipc_event_handle", handle.length + " bytes",
          "empty or " + CudaHandles.IPC_HANDLE_BYTES + " bytes");
    }
    return handle;
  }
}
