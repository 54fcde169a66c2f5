package io.gpumemd.common.unix;

import static io.gpumemd.common.unix.ErrnoCalls.call;

import com.sun.jna.LastErrorException;
import com.sun.jna.Pointer;
import java.io.IOException;

/**
 * Raw descriptor numbers, as they come from {@code SCM_RIGHTS} or native code and as the fd
 * channel sends them: open, duplicate, size, map and close one. Whoever holds a number closes it
 * exactly once (a number closed twice may by then name another file of the process).
 *
 * <p>Linux on a 64-bit architecture only ({@link UnsupportedPlatformException} elsewhere).
 * Stateless and thread-safe.
 */
public final class Descriptors {
  private Descriptors() {}

  /**
   * {@code open(path, O_RDONLY or O_RDWR | O_CLOEXEC)}: a new open file description, e.g. of
   * {@code /proc/self/fd/N} (the same file as N, with a mode and offset of its own).
   */
  public static int open(String path, boolean readOnly) throws IOException {
    Libc.bind();
    int flags = (readOnly ? Libc.O_RDONLY : Libc.O_RDWR) | Libc.O_CLOEXEC;
    return call(() -> Libc.open(path, flags));
  }

  /**
   * A new open file description of the file that this process's {@code fd} is open on, as
   * {@link #open} of {@code /proc/self/fd/FD} makes, through a descriptor of that directory kept
   * open for the process's life: the kernel walks one name instead of four.
   */
  public static int reopen(int fd, boolean readOnly) throws IOException {
    int directory = ownDescriptors();
    int flags = (readOnly ? Libc.O_RDONLY : Libc.O_RDWR) | Libc.O_CLOEXEC;
    return call(() -> Libc.openat(directory, Integer.toString(fd), flags));
  }

  /** This process's {@code /proc/self/fd}, opened at the first {@link #reopen} and never closed. */
  private static int ownDescriptors() throws IOException {
    int directory = ownDescriptors;
    if (directory < 0) {
      synchronized (Descriptors.class) {
        if (ownDescriptors < 0) {
          ownDescriptors = open("/proc/self/fd", true);
        }
        directory = ownDescriptors;
      }
    }
    return directory;
  }

  private static volatile int ownDescriptors = -1;

  /** A second descriptor of the same open file description. */
  public static int dup(int fd) throws IOException {
    Libc.bind();
    return call(() -> Libc.dup(fd));
  }

  /**
   * The size of the file behind {@code fd}, for a regular file or memfd ({@code lseek(fd, 0,
   * SEEK_END)}, which every glibc exports, unlike {@code fstat} before 2.33). Moves the offset of
   * the open file description: for a descriptor about to be mapped and closed.
   */
  public static long size(int fd) throws IOException {
    Libc.bind();
    try {
      return Libc.lseek(fd, 0, Libc.SEEK_END);
    } catch (LastErrorException e) {
      throw new ErrnoCalls.ErrnoException(e);
    }
  }

  /** {@code mmap(NULL, length, PROT_READ[|PROT_WRITE], MAP_SHARED, fd, 0)}. */
  public static Pointer mapShared(int fd, long length, boolean readOnly) throws IOException {
    Libc.bind();
    int protection = readOnly ? Libc.PROT_READ : Libc.PROT_READ | Libc.PROT_WRITE;
    Pointer address = call(() -> Libc.mmap(null, length, protection, Libc.MAP_SHARED, fd, 0));
    if (Pointer.nativeValue(address) == -1L) { // MAP_FAILED, should LastErrorException not fire
      throw new IOException("mmap failed");
    }
    return address;
  }

  /** {@code munmap}; an address that is not a mapping (EINVAL) has nothing to unmap. */
  public static void unmap(Pointer address, long length) {
    try {
      Libc.munmap(address, length);
    } catch (LastErrorException e) {
      // EINVAL only, for an address that is not a mapping: nothing is mapped there
    }
  }

  /**
   * Closes {@code fd}.
   *
   * @throws IOException EBADF (not open) or EIO; on Linux the number is released either way
   */
  public static void close(int fd) throws IOException {
    Libc.bind();
    call(() -> Libc.close(fd));
  }

  /** Closes {@code fd}, saying nothing of a failure (Linux releases the number anyway); below 0 is none. */
  public static void closeQuietly(int fd) {
    if (fd < 0) {
      return;
    }
    try {
      close(fd);
    } catch (IOException e) {
      // EBADF/EIO: the number is released anyway (Linux never leaves it open after close)
    }
  }
}
