package io.gpumemd.server.session;

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

  /**
   * An object name: 1 to 256 characters (code points), printable, without leading or trailing
   * white space. Control and format characters (right-to-left overrides, zero-width spaces),
   * line and paragraph separators and lone surrogates are refused: a name is shown in
   * line-based listings, where they would break or spoof the lines.
   */
  static String objectName(String name) {
    int length = name.codePointCount(0, name.length());
    if (length == 0) {
      throw InvalidRequestException.of("name", "''", "1 to " + SharedObjects.MAX_NAME_LENGTH + " characters");
    }
    if (length > SharedObjects.MAX_NAME_LENGTH) {
      throw InvalidRequestException.of("name", length + " characters", "at most " + SharedObjects.MAX_NAME_LENGTH);
    }
    int index = 0;
    for (int i = 0; i < name.length(); index++) {
      int c = name.codePointAt(i);
      int type = Character.getType(c);
      if (type == Character.CONTROL || type == Character.FORMAT || type == Character.LINE_SEPARATOR
          || type == Character.PARAGRAPH_SEPARATOR || type == Character.SURROGATE || type == Character.UNASSIGNED) {
        throw InvalidRequestException.of("name", String.format("U+%04X at index %d", c, index),
            "printable text (no control, format or separator characters)");
      }
      i += Character.charCount(c);
    }
    if (Character.isWhitespace(name.codePointAt(0)) || Character.isWhitespace(name.codePointBefore(name.length()))
        || Character.isSpaceChar(name.codePointAt(0)) || Character.isSpaceChar(name.codePointBefore(name.length()))) {
      throw InvalidRequestException.of("name", "'" + name + "'", "no leading or trailing white space");
    }
    return name;
  }
}
