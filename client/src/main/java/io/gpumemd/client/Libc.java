package io.gpumemd.client;

import static io.gpumemd.common.unix.ErrnoCalls.call;
import static io.gpumemd.common.unix.ErrnoCalls.retryOnInterrupt;

import com.sun.jna.Function;
import com.sun.jna.LastErrorException;
import com.sun.jna.Memory;
import com.sun.jna.Native;
import com.sun.jna.NativeLibrary;
import com.sun.jna.Platform;
import com.sun.jna.Pointer;
import java.io.IOException;
import java.lang.ref.Reference;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The few libc calls the fd channel needs and the JDK lacks for a raw descriptor: a Unix stream
 * socket, {@code recvmsg} with room for one {@code SCM_RIGHTS} descriptor, {@code fstat} (a
 * received descriptor's size), {@code mmap} and {@code munmap}. Bound through JNA (direct
 * mapping) on first use.
 *
 * <p>Linux on a 64-bit (LP64) architecture only: the struct layouts below ({@code msghdr},
 * {@code cmsghdr}, {@code timeval}, {@code sockaddr_un}, the offset of {@code stat.st_size}) and
 * the constants are Linux's, the same on x86-64 and aarch64. {@link #check()} says so on any other platform.
 *
 * <p>Stateless and thread-safe; each call's native buffers are its own.
 */
final class Libc {
  static final int AF_UNIX = 1;
  static final int SOCK_STREAM = 1;
  static final int SOCK_CLOEXEC = 0x80000;
  static final int SOL_SOCKET = 1;
  static final int SO_RCVTIMEO = 20;
  static final int SO_SNDTIMEO = 21;
  static final int SCM_RIGHTS = 1;
  static final int MSG_CTRUNC = 0x8;
  static final int MSG_NOSIGNAL = 0x4000;
  static final int MSG_CMSG_CLOEXEC = 0x40000000;
  static final int SHUT_RDWR = 2;
  static final int PROT_READ = 1;
  static final int PROT_WRITE = 2;
  static final int MAP_SHARED = 1;

  private static final int SUN_PATH_MAX = 108;
  /** sizeof(struct msghdr) and sizeof(struct iovec) on LP64. */
  private static final int MSGHDR = 56;
  private static final int IOVEC = 16;
  /** CMSG_SPACE(sizeof(int)) on LP64: a 16-byte header, 4 bytes of data padded to 8. */
  private static final int CMSG_SPACE_ONE_FD = 24;
  /** CMSG_LEN(sizeof(int)): the header and one descriptor. */
  private static final int CMSG_LEN_ONE_FD = 20;
  /** offsetof(struct stat, st_size): 48 on x86-64 and on aarch64 (the generic layout). */
  private static final int STAT_ST_SIZE = 48;
  /** Room for struct stat: 144 bytes on x86-64, 128 on aarch64. */
  private static final int STAT_BYTES = 256;

  private static volatile boolean bound;

  private Libc() {}

  // ------------------------------------------------------------------ native (direct mapping)

  private static native int socket(int domain, int type, int protocol) throws LastErrorException;

  private static native int connect(int fd, Pointer address, int length) throws LastErrorException;

  private static native int setsockopt(int fd, int level, int name, Pointer value, int length)
      throws LastErrorException;

  private static native long send(int fd, Pointer buffer, long length, int flags) throws LastErrorException;

  private static native long recv(int fd, Pointer buffer, long length, int flags) throws LastErrorException;

  private static native long recvmsg(int fd, Pointer message, int flags) throws LastErrorException;

  private static native int shutdown(int fd, int how) throws LastErrorException;

  private static native int close(int fd) throws LastErrorException;

  private static native Pointer mmap(Pointer address, long length, int protection, int flags, int fd, long offset)
      throws LastErrorException;

  private static native int munmap(Pointer address, long length) throws LastErrorException;

  /**
   * Binds the natives once.
   *
   * @throws GpuMemException UNIMPLEMENTED where the layouts above do not hold
   */
  static void check() {
    if (bound) {
      return;
    }
    synchronized (Libc.class) {
      if (bound) {
        return;
      }
      if (!Platform.isLinux() || Native.POINTER_SIZE != 8) {
        throw new GpuMemException(io.grpc.Status.Code.UNIMPLEMENTED, "segments passed as file descriptors "
            + "(--host-segments fd) are mapped on 64-bit Linux only; this is " + System.getProperty("os.name")
            + " " + System.getProperty("os.arch") + " (ask the operator for --host-segments path)", null);
      }
      Native.register(Libc.class, Platform.C_LIBRARY_NAME);
      bound = true;
    }
  }

  // ------------------------------------------------------------------ calls

  /** A connected Unix stream socket (close-on-exec) with send and receive timeouts. */
  static int connectUnix(String path, long timeoutMillis) throws IOException {
    check();
    byte[] name = path.getBytes(StandardCharsets.UTF_8);
    if (name.length >= SUN_PATH_MAX) {
      throw new IOException("socket path of " + name.length + " bytes (at most " + (SUN_PATH_MAX - 1) + ")");
    }
    int fd = call(() -> socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    try {
      // the send timeout also bounds connect() on a Unix socket whose backlog is full
      Memory timeval = new Memory(16);
      timeval.setLong(0, timeoutMillis / 1000);
      timeval.setLong(8, (timeoutMillis % 1000) * 1000);
      call(() -> setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, timeval, 16));
      call(() -> setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, timeval, 16));
      Reference.reachabilityFence(timeval);
      Memory address = new Memory(2 + SUN_PATH_MAX);
      address.clear();
      address.setShort(0, (short) AF_UNIX);
      address.write(2, name, 0, name.length);
      call(() -> connect(fd, address, 2 + name.length + 1));
      Reference.reachabilityFence(address);
      return fd;
    } catch (IOException | RuntimeException e) {
      closeQuietly(fd);
      throw e;
    }
  }

  /** Sends all of {@code bytes}. */
  static void sendAll(int fd, byte[] bytes) throws IOException {
    Memory buffer = new Memory(bytes.length);
    buffer.write(0, bytes, 0, bytes.length);
    long sent = 0;
    while (sent < bytes.length) {
      long at = sent;
      sent += retryOnInterrupt(() -> send(fd, buffer.share(at), bytes.length - at, MSG_NOSIGNAL));
    }
    Reference.reachabilityFence(buffer); // a shared Pointer does not keep its Memory alive
  }

  /** Reads exactly {@code n} bytes (never more: the byte after a granted reply carries a descriptor). */
  static byte[] receiveExactly(int fd, int n) throws IOException {
    Memory buffer = new Memory(Math.max(n, 1));
    long read = 0;
    while (read < n) {
      long at = read;
      long got = retryOnInterrupt(() -> recv(fd, buffer.share(at), n - at, 0));
      if (got == 0) {
        throw new IOException("the daemon closed the fd channel in the middle of a reply");
      }
      read += got;
    }
    return buffer.getByteArray(0, n);
  }

  /**
   * Receives the one byte that carries a descriptor ({@code recvmsg} with room for one, received
   * close-on-exec) and returns the descriptor.
   *
   * @throws IOException when the byte came without exactly one descriptor (any that came is closed)
   */
  static int receiveDescriptor(int fd) throws IOException {
    // One block for the msghdr and everything it points to: a separate Memory that only the
    // native side still refers to could be freed by the GC during the call.
    Memory block = new Memory(MSGHDR + IOVEC + CMSG_SPACE_ONE_FD + 8);
    block.clear();
    Pointer iov = block.share(MSGHDR);
    Pointer control = block.share(MSGHDR + IOVEC);
    Pointer data = block.share(MSGHDR + IOVEC + CMSG_SPACE_ONE_FD);
    iov.setPointer(0, data);
    iov.setLong(8, 1);
    block.setPointer(16, iov); // msg_iov
    block.setLong(24, 1); // msg_iovlen
    block.setPointer(32, control); // msg_control
    block.setLong(40, CMSG_SPACE_ONE_FD); // msg_controllen
    long got;
    try {
      got = retryOnInterrupt(() -> recvmsg(fd, block, MSG_CMSG_CLOEXEC));
    } finally {
      Reference.reachabilityFence(block);
    }
    if (got == 0) {
      throw new IOException("the daemon closed the fd channel before the descriptor of a granted reply");
    }
    long controlLength = block.getLong(40);
    int flags = block.getInt(48);
    int received = -1;
    if (controlLength >= CMSG_LEN_ONE_FD && control.getLong(0) >= CMSG_LEN_ONE_FD
        && control.getInt(8) == SOL_SOCKET && control.getInt(12) == SCM_RIGHTS) {
      received = control.getInt(16);
    }
    if (received < 0 || (flags & MSG_CTRUNC) != 0) {
      if (received >= 0) {
        closeQuietly(received);
      }
      throw new IOException("the daemon's granted reply came without its descriptor");
    }
    return received;
  }

  /** {@code mmap(NULL, length, PROT_READ[|PROT_WRITE], MAP_SHARED, fd, 0)}. */
  static Pointer mapShared(int fd, long length, boolean readOnly) throws IOException {
    check();
    int protection = readOnly ? PROT_READ : PROT_READ | PROT_WRITE;
    Pointer address = call(() -> mmap(null, length, protection, MAP_SHARED, fd, 0));
    if (Pointer.nativeValue(address) == -1L) { // MAP_FAILED, should LastErrorException not fire
      throw new IOException("mmap failed");
    }
    return address;
  }

  /**
   * The size of the file behind {@code fd}: {@code fstat}'s {@code st_size}. glibc exports
   * {@code fstat} since 2.33 only (before, {@code __fxstat}), so it is looked up on its own, not
   * bound with the others, which must not fail with it; without it, {@code stat} of {@code
   * /proc/self/fd/N}, which follows the descriptor to the same file.
   */
  static long fileSize(int fd) throws IOException {
    check();
    Function fstat;
    try {
      fstat = NativeLibrary.getInstance(Platform.C_LIBRARY_NAME).getFunction("fstat", Function.THROW_LAST_ERROR);
    } catch (UnsatisfiedLinkError e) {
      return Files.size(Path.of("/proc/self/fd/" + fd));
    }
    Memory stat = new Memory(STAT_BYTES);
    stat.clear();
    try {
      fstat.invokeInt(new Object[] {fd, stat});
    } catch (LastErrorException e) {
      throw new IOException("fstat: " + e.getMessage(), e);
    }
    return stat.getLong(STAT_ST_SIZE);
  }

  static void unmap(Pointer address, long length) {
    try {
      munmap(address, length);
    } catch (LastErrorException e) {
      // EINVAL only, for an address that is not a mapping: nothing is mapped there
    }
  }

  /** Stops a blocked receive on {@code fd} from another thread (the number stays open). */
  static void shutdownQuietly(int fd) {
    try {
      shutdown(fd, SHUT_RDWR);
    } catch (LastErrorException e) {
      // not connected any more: nothing to stop
    }
  }

  static void closeQuietly(int fd) {
    try {
      close(fd);
    } catch (LastErrorException e) {
      // EBADF/EIO: the number is released anyway (Linux never leaves it open after close)
    }
  }
}
