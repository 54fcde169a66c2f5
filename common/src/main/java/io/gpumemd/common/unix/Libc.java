package io.gpumemd.common.unix;

import com.sun.jna.LastErrorException;
import com.sun.jna.Native;
import com.sun.jna.Platform;
import com.sun.jna.Pointer;

/**
 * The libc calls of this package, bound through JNA (direct mapping: one JNI call each, no
 * argument conversion beyond a {@code String}'s) on first use, and the Linux LP64 layouts and
 * constants they take. Everything here is the kernel's or glibc's ABI, the same on x86-64 and
 * aarch64; {@link #bind()} refuses any other platform.
 *
 * <p>Stateless and thread-safe; package-private: callers go through {@link UnixSockets}, {@link
 * MessageBuffer}, {@link Descriptors} and {@link Pidfd}.
 */
final class Libc {
  static final int AF_UNIX = 1;
  static final int SOCK_STREAM = 1;
  static final int SOCK_CLOEXEC = 0x80000;
  static final int SOL_SOCKET = 1;
  static final int SO_PEERCRED = 17;
  /** The peer's pidfd (Linux 6.5). */
  static final int SO_PEERPIDFD = 77;
  static final int SO_RCVTIMEO = 20;
  static final int SO_SNDTIMEO = 21;
  static final int SCM_RIGHTS = 1;
  static final int MSG_CTRUNC = 0x8;
  static final int MSG_NOSIGNAL = 0x4000;
  static final int MSG_CMSG_CLOEXEC = 0x40000000;
  static final int SHUT_RD = 0;
  static final int SHUT_RDWR = 2;
  /** ioctl: bytes sent on a socket and not yet read by its peer (Unix stream: what waits in the peer's queue). */
  static final long SIOCOUTQ = 0x5411;
  /** FIONREAD (SIOCINQ): bytes waiting to be read on a socket. */
  static final long FIONREAD = 0x541B;
  static final int O_RDONLY = 0;
  static final int O_RDWR = 2;
  static final int O_CLOEXEC = 0x80000;
  static final int SEEK_END = 2;
  static final int PROT_READ = 1;
  static final int PROT_WRITE = 2;
  static final int PROT_NONE = 0;
  static final int MAP_SHARED = 0x01;
  static final int MAP_PRIVATE = 0x02;
  static final int MAP_FIXED = 0x10;
  static final int MAP_ANONYMOUS = 0x20;
  static final int MAP_NORESERVE = 0x4000;

  /** sizeof(sockaddr_un.sun_path). */
  static final int SUN_PATH_MAX = 108;
  /** sizeof(struct msghdr) and sizeof(struct iovec). */
  static final int MSGHDR = 56;
  /** sizeof(struct mmsghdr): a msghdr, then msg_len (unsigned int), padded to 8. */
  static final int MMSGHDR = 64;
  static final int IOVEC = 16;
  /** Offsets in struct msghdr. */
  static final int MSG_IOV = 16;
  static final int MSG_IOVLEN = 24;
  static final int MSG_CONTROL = 32;
  static final int MSG_CONTROLLEN = 40;
  static final int MSG_FLAGS = 48;
  /** sizeof(struct cmsghdr): cmsg_len (size_t), cmsg_level, cmsg_type; the data follows. */
  static final int CMSG_HEADER = 16;

  private static volatile boolean bound;

  private Libc() {}

  static native int socket(int domain, int type, int protocol) throws LastErrorException;

  static native int bind(int fd, Pointer address, int length) throws LastErrorException;

  static native int listen(int fd, int backlog) throws LastErrorException;

  static native int accept4(int fd, Pointer address, Pointer length, int flags) throws LastErrorException;

  static native int connect(int fd, Pointer address, int length) throws LastErrorException;

  static native int setsockopt(int fd, int level, int name, Pointer value, int length) throws LastErrorException;

  static native int getsockopt(int fd, int level, int name, Pointer value, Pointer length) throws LastErrorException;

  static native long sendmsg(int fd, Pointer message, int flags) throws LastErrorException;

  static native long recvmsg(int fd, Pointer message, int flags) throws LastErrorException;

  static native int sendmmsg(int fd, Pointer messages, int count, int flags) throws LastErrorException;

  static native int shutdown(int fd, int how) throws LastErrorException;

  static native int ioctl(int fd, long request, int[] out) throws LastErrorException;

  static native int open(String path, int flags) throws LastErrorException;

  static native int openat(int directory, String path, int flags) throws LastErrorException;

  static native long lseek(int fd, long offset, int whence) throws LastErrorException;

  static native int dup(int fd) throws LastErrorException;

  static native int close(int fd) throws LastErrorException;

  static native Pointer mmap(Pointer address, long length, int protection, int flags, int fd, long offset)
      throws LastErrorException;

  static native int munmap(Pointer address, long length) throws LastErrorException;

  static native int madvise(Pointer address, long length, int advice) throws LastErrorException;

  /** {@code struct pollfd}: fd (int), events (short), revents (short). */
  static final int POLLFD = 8;
  static final short POLLIN = 0x1;
  static final short POLLHUP = 0x10;

  static native int poll(Pointer fds, long count, int timeoutMillis) throws LastErrorException;

  /** {@code struct statfs} is 120 bytes on LP64 Linux; f_type (a long) comes first. */
  static final int STATFS = 120;
  /** {@code f_type} of the pidfs file system (Linux 6.9), where a pidfd's inode names its process. */
  static final long PIDFS_MAGIC = 0x50494446L;

  static native int fstatfs(int fd, Pointer buffer) throws LastErrorException;

  /**
   * Binds the natives once.
   *
   * @throws UnsupportedPlatformException anywhere but 64-bit Linux, where the layouts above do not hold
   */
  static void bind() throws UnsupportedPlatformException {
    if (bound) {
      return;
    }
    synchronized (Libc.class) {
      if (bound) {
        return;
      }
      if (!Platform.isLinux() || Native.POINTER_SIZE != 8) {
        throw new UnsupportedPlatformException();
      }
      Native.register(Libc.class, Platform.C_LIBRARY_NAME);
      bound = true;
    }
  }
}
