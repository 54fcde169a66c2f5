package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.BackendException;
import java.io.FileDescriptor;
import java.lang.reflect.Field;
import java.lang.reflect.Method;

/**
 * The descriptor number behind a {@link java.io.FileDescriptor}, which the fd channel needs to
 * send it ({@code SCM_RIGHTS} through Netty takes an int). Java 17 has no public way to read it,
 * and Netty's own {@code FileDescriptor.from(path)} opens write-only and truncates, which no
 * client could map. So this reads the private {@code fd} field through {@code
 * sun.misc.Unsafe} (module {@code jdk.unsupported}, open to every class path application, as
 * Netty uses it): no {@code --add-opens} needed, so {@code java -jar gpumemd.jar} works as it
 * is. The field has held the number since Java 1.0; {@link HostShmBackend} checks each number
 * it reads against {@code /proc/self/fd} before trusting it, and {@link #check} fails the start
 * of a daemon where the field cannot be read.
 *
 * <p>Stateless after class initialization; thread-safe.
 */
final class JdkFdNumbers {
  private static final Object UNSAFE;
  private static final Method GET_INT;
  private static final long FD_OFFSET;
  private static final Throwable FAILURE;

  static {
    Object unsafe = null;
    Method getInt = null;
    long offset = -1;
    Throwable failure = null;
    try {
      Class<?> type = Class.forName("sun.misc.Unsafe");
      Field theUnsafe = type.getDeclaredField("theUnsafe");
      theUnsafe.setAccessible(true);
      unsafe = theUnsafe.get(null);
      // getDeclaredField needs no access check; only reading the field would.
      Field fd = FileDescriptor.class.getDeclaredField("fd");
      offset = (Long) type.getMethod("objectFieldOffset", Field.class).invoke(unsafe, fd);
      getInt = type.getMethod("getInt", Object.class, long.class);
    } catch (ReflectiveOperationException | RuntimeException e) {
      failure = e;
    }
    UNSAFE = unsafe;
    GET_INT = getInt;
    FD_OFFSET = offset;
    FAILURE = failure;
  }

  private JdkFdNumbers() {}

  /**
   * Fails when this JVM does not let the numbers be read.
   *
   * @throws BackendException naming the cause
   */
  static void check() {
    if (FAILURE != null) {
      throw new BackendException("host-segments: fd needs the descriptor numbers of open files, and this JVM "
          + "does not show them (" + FAILURE + "); use --host-segments path", FAILURE);
    }
  }

  /** The number of an open descriptor; -1 for a closed one. */
  static int of(FileDescriptor descriptor) {
    check();
    try {
      return (Integer) GET_INT.invoke(UNSAFE, descriptor, FD_OFFSET);
    } catch (ReflectiveOperationException e) {
      throw new BackendException("cannot read a descriptor number: " + e, e);
    }
  }
}
