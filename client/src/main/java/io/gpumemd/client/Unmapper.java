package io.gpumemd.client;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;

/**
 * Unmaps a {@link MappedByteBuffer} at once ({@code sun.misc.Unsafe.invokeCleaner}) instead of
 * leaving it to the garbage collector: a dropped mapping of a deleted shared-memory file holds
 * its memory until a GC runs. Any buffer derived from an unmapped one must not be used again.
 * Stateless and thread-safe.
 */
public final class Unmapper {
  private static final Method INVOKE_CLEANER;
  private static final Object UNSAFE;

  static {
    Method cleaner = null;
    Object unsafe = null;
    try {
      Class<?> type = Class.forName("sun.misc.Unsafe");
      Field field = type.getDeclaredField("theUnsafe");
      field.setAccessible(true);
      unsafe = field.get(null);
      cleaner = type.getMethod("invokeCleaner", ByteBuffer.class);
    } catch (ReflectiveOperationException | RuntimeException e) {
      // unavailable on this JVM: mappings are released by the GC; correct, only later
    }
    INVOKE_CLEANER = cleaner;
    UNSAFE = unsafe;
  }

  private Unmapper() {}

  /** True when {@link #unmap} releases the mapping at once. */
  public static boolean immediate() {
    return INVOKE_CLEANER != null;
  }

  /** Unmaps now where the JVM allows it; otherwise leaves the mapping to the GC. */
  public static void unmap(MappedByteBuffer buffer) {
    if (INVOKE_CLEANER != null) {
      try {
        INVOKE_CLEANER.invoke(UNSAFE, buffer);
      } catch (ReflectiveOperationException e) {
        // fall back to the GC
      }
    }
  }
}
