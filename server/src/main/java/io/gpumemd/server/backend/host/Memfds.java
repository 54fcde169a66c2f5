package io.gpumemd.server.backend.host;

import static io.gpumemd.common.unix.ErrnoCalls.call;

import com.sun.jna.LastErrorException;
import com.sun.jna.Native;
import com.sun.jna.Platform;
import io.gpumemd.common.unix.ErrnoCalls.ErrnoException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * The libc calls of the host backend's segments in descriptor mode, which the JDK lacks: {@code
 * memfd_create}, the seals ({@code fcntl F_ADD_SEALS / F_GET_SEALS}), {@code fchmod} and {@code
 * close} of a raw number. Bound through JNA (direct mapping) on first use.
 *
 * <p>Why seals: a client's writable descriptor could otherwise {@code ftruncate} or {@code
 * fallocate} the daemon's file, growing it outside every budget (its memory stays until the
 * daemon frees the segment) or shrinking it (every other process mapping it gets SIGBUS). A
 * segment is sealed against growing and shrinking, and against further seals (so that nobody can
 * add the write seal and stop the daemon zeroing it), before any descriptor of it leaves the
 * daemon. Seals belong to the inode: every descriptor of the segment, reopened or received,
 * obeys them.
 *
 * <p>Linux only (memfds and seals are Linux's; the constants below are the kernel's, the same on
 * every architecture). {@code fcntl} is variadic in C; it is bound with one {@code int} argument,
 * which the x86-64 and aarch64 calling conventions pass like a non-variadic one.
 *
 * <p>Stateless and thread-safe.
 */
final class Memfds {
  static final int MFD_CLOEXEC = 0x1;
  static final int MFD_ALLOW_SEALING = 0x2;
  /** Linux 6.3+: no exec bits, sealed so; older kernels refuse the flag (EINVAL). */
  static final int MFD_NOEXEC_SEAL = 0x8;
  static final int F_ADD_SEALS = 1024 + 9;
  static final int F_GET_SEALS = 1024 + 10;
  static final int F_SEAL_SEAL = 0x1;
  static final int F_SEAL_SHRINK = 0x2;
  static final int F_SEAL_GROW = 0x4;
  static final int F_SEAL_WRITE = 0x8;
  static final int F_SEAL_FUTURE_WRITE = 0x10;
  static final int F_SEAL_EXEC = 0x20;
  /** What a segment carries: its size is fixed, and no seal can be added (the write seal, say). */
  static final int SEGMENT_SEALS = F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;
  /** Every segment's memfd name starts so ({@code /proc/self/fd} shows {@code /memfd:NAME (deleted)}). */
  static final String NAME_PREFIX = "gpumemd-seg-";
  private static final int EINVAL = 22;
  static final int EOPNOTSUPP = 95;

  private static volatile boolean bound;
  /** False once the kernel refused MFD_NOEXEC_SEAL (before Linux 6.3): not asked again. */
  private static volatile boolean noExecSeal = true;

  private Memfds() {}

  private static native int memfd_create(String name, int flags) throws LastErrorException;

  private static native int fcntl(int fd, int command, int argument) throws LastErrorException;

  private static native int fchmod(int fd, int mode) throws LastErrorException;

  private static native int close(int fd) throws LastErrorException;

  private static native int fallocate(int fd, int mode, long offset, long length) throws LastErrorException;

  private static void check() throws IOException {
    if (bound) {
      return;
    }
    synchronized (Memfds.class) {
      if (bound) {
        return;
      }
      if (!Platform.isLinux()) {
        throw new IOException("host segments as descriptors are sealed memfds, which need Linux; this is "
            + System.getProperty("os.name") + " (use --host-segments path)");
      }
      Native.register(Memfds.class, Platform.C_LIBRARY_NAME);
      bound = true;
    }
  }

  /**
   * A new memfd, close-on-exec, that allows seals, mode 0600: a memfd is made 0777, and a holder
   * of a read-only descriptor could then reopen it read-write through {@code /proc/PID/fd}, which
   * opens by the inode's mode; 0600 leaves that to the daemon's own uid. The raw number is the
   * caller's to {@link #close}.
   */
  static int create(String name) throws IOException {
    check();
    int fd = -1;
    if (noExecSeal) {
      try {
        fd = call(() -> memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL));
      } catch (ErrnoException e) {
        if (e.errno() != EINVAL) {
          throw new IOException("memfd_create " + name + ": " + e.getMessage(), e);
        }
        noExecSeal = false;
      }
    }
    if (fd < 0) {
      try {
        fd = call(() -> memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
      } catch (ErrnoException e) {
        throw new IOException("memfd_create " + name + ": " + e.getMessage(), e);
      }
    }
    int created = fd;
    try {
      call(() -> fchmod(created, 0600));
    } catch (ErrnoException e) {
      closeQuietly(created);
      throw new IOException("fchmod 0600 of memfd " + name + ": " + e.getMessage(), e);
    }
    return created;
  }

  /**
   * Gives the memfd of {@code fd} its {@code bytes} of pages now ({@code fallocate}, mode 0): the
   * kernel's shmem allocates them zeroed and charges them at once, as writing zeros would, but
   * without copying the zeros in; no memory is ENOSPC or ENOMEM here, not a SIGBUS at a client's
   * first touch.
   *
   * @throws ErrnoException with the kernel's errno (EOPNOTSUPP where the file cannot be
   *     allocated so: the caller writes zeros instead)
   */
  static void allocate(int fd, long bytes) throws IOException {
    check();
    call(() -> fallocate(fd, 0, 0, bytes));
  }

  /** Adds {@link #SEGMENT_SEALS} to the file of {@code fd} (any descriptor of it). */
  static void seal(int fd) throws IOException {
    check();
    try {
      call(() -> fcntl(fd, F_ADD_SEALS, SEGMENT_SEALS));
    } catch (ErrnoException e) {
      throw new IOException("F_ADD_SEALS " + describe(SEGMENT_SEALS) + " on fd " + fd + ": " + e.getMessage(), e);
    }
  }

  /**
   * The seals of the file of {@code fd}.
   *
   * @throws ErrnoException EINVAL for a file that is no memfd or tmpfs file
   */
  static int seals(int fd) throws IOException {
    check();
    return call(() -> fcntl(fd, F_GET_SEALS, 0));
  }

  /** Closes a raw number no Java object owns. */
  static void closeQuietly(int fd) {
    try {
      close(fd);
    } catch (LastErrorException e) {
      // close(2) releases the number even when it reports an error (EIO); nothing to undo
    }
  }

  /** The names of a seal set, for messages: {@code F_SEAL_GROW|F_SEAL_SHRINK}, or {@code none}. */
  static String describe(int seals) {
    List<String> names = new ArrayList<>();
    String[] known = {"F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE", "F_SEAL_FUTURE_WRITE", "F_SEAL_EXEC"};
    for (int bit = 0; bit < known.length; bit++) {
      if ((seals & (1 << bit)) != 0) {
        names.add(known[bit]);
      }
    }
    int unknown = seals & ~((1 << known.length) - 1);
    if (unknown != 0) {
      names.add("0x" + Integer.toHexString(unknown));
    }
    return names.isEmpty() ? "none" : String.join("|", names);
  }
}
