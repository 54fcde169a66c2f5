package io.gpumemd.server.takeover;

import static io.gpumemd.common.unix.ErrnoCalls.call;
import static io.gpumemd.common.unix.ErrnoCalls.retryOnInterrupt;

import com.sun.jna.LastErrorException;
import com.sun.jna.Memory;
import com.sun.jna.Native;
import com.sun.jna.Platform;
import com.sun.jna.Pointer;
import java.io.IOException;
import java.lang.ref.Reference;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.List;

/**
 * The libc calls of the take-over socket, which the JDK lacks: a blocking Unix stream socket
 * that passes descriptors ({@code sendmsg}/{@code recvmsg} with {@code SCM_RIGHTS}) and tells
 * its peer's uid ({@code SO_PEERCRED}). Bound through JNA (direct mapping) on first use.
 *
 * <p>Linux on a 64-bit (LP64) architecture only: the layouts of {@code msghdr}, {@code cmsghdr},
 * {@code ucred}, {@code timeval} and {@code sockaddr_un} below are Linux's, the same on x86-64
 * and aarch64.
 *
 * <p>Stateless and thread-safe; each call's native buffers are its own.
 */
final class UnixSockets {
  private static final int AF_UNIX = 1;
  private static final int SOCK_STREAM = 1;
  private static final int SOCK_CLOEXEC = 0x80000;
  private static final int SOL_SOCKET = 1;
  private static final int SO_PEERCRED = 17;
  private static final int SO_RCVTIMEO = 20;
  private static final int SO_SNDTIMEO = 21;
  private static final int SCM_RIGHTS = 1;
  private static final int MSG_CTRUNC = 0x8;
  private static final int MSG_NOSIGNAL = 0x4000;
  private static final int MSG_CMSG_CLOEXEC = 0x40000000;
  private static final int SHUT_RD = 0;
  private static final int SHUT_RDWR = 2;
  private static final int SUN_PATH_MAX = 108;
  private static final int MSGHDR = 56;
  private static final int IOVEC = 16;
  private static final int CMSG_HEADER = 16;
  /** Most descriptors one frame carries (the kernel's SCM_MAX_FD is 253). */
  static final int MAX_FDS_PER_FRAME = 200;
  private static final int CONTROL_BYTES = CMSG_HEADER + 4 * MAX_FDS_PER_FRAME + 8;
  /** The most bytes one {@code recvmsg} reads: the native buffer of a receive. */
  static final int MAX_CHUNK_BYTES = 1 << 20;

  private static volatile boolean bound;

  private UnixSockets() {}

  private static native int socket(int domain, int type, int protocol) throws LastErrorException;

  private static native int bind(int fd, Pointer address, int length) throws LastErrorException;

  private static native int listen(int fd, int backlog) throws LastErrorException;

  private static native int accept4(int fd, Pointer address, Pointer length, int flags) throws LastErrorException;

  private static native int connect(int fd, Pointer address, int length) throws LastErrorException;

  private static native int setsockopt(int fd, int level, int name, Pointer value, int length)
      throws LastErrorException;

  private static native int getsockopt(int fd, int level, int name, Pointer value, Pointer length)
      throws LastErrorException;

  private static native long sendmsg(int fd, Pointer message, int flags) throws LastErrorException;

  private static native long recvmsg(int fd, Pointer message, int flags) throws LastErrorException;

  private static native int shutdown(int fd, int how) throws LastErrorException;

  private static native int close(int fd) throws LastErrorException;

  private static native int dup(int fd) throws LastErrorException;

  static void check() throws IOException {
    if (bound) {
      return;
    }
    synchronized (UnixSockets.class) {
      if (bound) {
        return;
      }
      if (!Platform.isLinux() || Native.POINTER_SIZE != 8) {
        throw new IOException("take-over needs 64-bit Linux; this is " + System.getProperty("os.name") + " "
            + System.getProperty("os.arch"));
      }
      Native.register(UnixSockets.class, Platform.C_LIBRARY_NAME);
      bound = true;
    }
  }

  private static Memory address(String path) throws IOException {
    byte[] name = path.getBytes(StandardCharsets.UTF_8);
    if (name.length >= SUN_PATH_MAX) {
      throw new IOException("socket path of " + name.length + " bytes (at most " + (SUN_PATH_MAX - 1) + "): " + path);
    }
    Memory address = new Memory(2 + SUN_PATH_MAX);
    address.clear();
    address.setShort(0, (short) AF_UNIX);
    address.write(2, name, 0, name.length);
    return address;
  }

  /** A listening Unix stream socket bound at {@code path} (which must not exist). */
  static int listen(String path) throws IOException {
    check();
    Memory address = address(path);
    int fd = call(() -> socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    try {
      call(() -> bind(fd, address, 2 + SUN_PATH_MAX));
      call(() -> listen(fd, 4));
      return fd;
    } catch (IOException e) {
      closeQuietly(fd);
      throw e;
    } finally {
      Reference.reachabilityFence(address);
    }
  }

  /** Waits for a connection; {@link #shutdownQuietly} of the listening socket ends the wait with an IOException. */
  static int accept(int listening) throws IOException {
    return (int) retryOnInterrupt(() -> accept4(listening, null, null, SOCK_CLOEXEC));
  }

  /** Connects to {@code path}. */
  static int connect(String path) throws IOException {
    check();
    Memory address = address(path);
    int fd = call(() -> socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    try {
      call(() -> connect(fd, address, 2 + SUN_PATH_MAX));
      return fd;
    } catch (IOException e) {
      closeQuietly(fd);
      throw e;
    } finally {
      Reference.reachabilityFence(address);
    }
  }

  /** Bounds every later send and receive on {@code fd} (0 = wait forever). */
  static void timeouts(int fd, long millis) throws IOException {
    Memory timeval = new Memory(16);
    timeval.setLong(0, millis / 1000);
    timeval.setLong(8, (millis % 1000) * 1000);
    call(() -> setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, timeval, 16));
    call(() -> setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, timeval, 16));
    Reference.reachabilityFence(timeval);
  }

  /** The peer's {pid, uid, gid} as the kernel recorded them at connect (SO_PEERCRED). */
  static int[] peerCredentials(int fd) throws IOException {
    Memory ucred = new Memory(12);
    Memory length = new Memory(4);
    length.setInt(0, 12);
    call(() -> getsockopt(fd, SOL_SOCKET, SO_PEERCRED, ucred, length));
    return new int[] {ucred.getInt(0), ucred.getInt(4), ucred.getInt(8)};
  }

  /** The deadline of a send or receive passed (see {@link #send}). */
  static final class DeadlinePassed extends IOException {
    DeadlinePassed() {
      super("the peer did not keep up within the deadline");
    }
  }

  /**
   * Before each {@code sendmsg}/{@code recvmsg} of one send or receive: with a deadline ({@code
   * System.nanoTime()} based, 0 for none), the socket's timeouts become what is left of it, so a
   * peer that trickles a byte at a time cannot stretch the whole beyond it.
   */
  private static void towards(int fd, long deadlineNanos) throws IOException {
    if (deadlineNanos == 0) {
      return;
    }
    long left = deadlineNanos - System.nanoTime();
    if (left <= 0) {
      throw new DeadlinePassed();
    }
    timeouts(fd, Math.max(1, left / 1_000_000));
  }

  static void send(int fd, byte[] bytes, List<Integer> fds) throws IOException {
    send(fd, bytes, fds, 0);
  }

  /**
   * Sends all of {@code bytes}, with {@code fds} attached to the first byte (at most {@link
   * #MAX_FDS_PER_FRAME}), by {@code deadlineNanos} if not 0.
   */
  static void send(int fd, byte[] bytes, List<Integer> fds, long deadlineNanos) throws IOException {
    if (fds.size() > MAX_FDS_PER_FRAME) {
      throw new IllegalArgumentException(fds.size() + " descriptors in one frame");
    }
    Memory block = new Memory(MSGHDR + IOVEC + CONTROL_BYTES + Math.max(1, bytes.length));
    int sent = 0;
    boolean withFds = !fds.isEmpty();
    try {
      while (sent < bytes.length) {
        block.clear(MSGHDR + IOVEC + CONTROL_BYTES);
        Pointer iov = block.share(MSGHDR);
        Pointer control = block.share(MSGHDR + IOVEC);
        Pointer data = block.share(MSGHDR + IOVEC + CONTROL_BYTES);
        if (sent == 0) {
          data.write(0, bytes, 0, bytes.length);
        }
        iov.setPointer(0, data.share(sent));
        iov.setLong(8, bytes.length - sent);
        block.setPointer(16, iov);
        block.setLong(24, 1);
        if (withFds) {
          int length = CMSG_HEADER + 4 * fds.size();
          control.setLong(0, length);
          control.setInt(8, SOL_SOCKET);
          control.setInt(12, SCM_RIGHTS);
          for (int i = 0; i < fds.size(); i++) {
            control.setInt(CMSG_HEADER + 4L * i, fds.get(i));
          }
          block.setPointer(32, control);
          block.setLong(40, (length + 7) & ~7);
        }
        towards(fd, deadlineNanos);
        long n = retryOnInterrupt(() -> sendmsg(fd, block, MSG_NOSIGNAL));
        sent += (int) n;
        withFds = false; // the descriptors went with the first byte sent
      }
    } finally {
      Reference.reachabilityFence(block);
    }
  }

  /**
   * Reads exactly {@code n} bytes into {@code out} from {@code offset}; descriptors that arrive
   * with them are appended to {@code fds} (received close-on-exec). The native buffer is at most
   * {@link #MAX_CHUNK_BYTES} whatever {@code n} is: a caller reads a large frame chunk by chunk
   * and grows its array only as bytes really arrive.
   *
   * @throws java.io.EOFException when the peer closed first
   */
  static void receive(int fd, byte[] out, int offset, int n, ArrayDeque<Integer> fds) throws IOException {
    receive(fd, out, offset, n, fds, 0);
  }

  /** {@link #receive(int, byte[], int, int, ArrayDeque)} by {@code deadlineNanos} if not 0. */
  static void receive(int fd, byte[] out, int offset, int n, ArrayDeque<Integer> fds, long deadlineNanos)
      throws IOException {
    int chunk = Math.max(1, Math.min(n, MAX_CHUNK_BYTES));
    Memory block = new Memory(MSGHDR + IOVEC + CONTROL_BYTES + chunk);
    int read = 0;
    try {
      while (read < n) {
        block.clear(MSGHDR + IOVEC + CONTROL_BYTES);
        Pointer iov = block.share(MSGHDR);
        Pointer control = block.share(MSGHDR + IOVEC);
        Pointer data = block.share(MSGHDR + IOVEC + CONTROL_BYTES);
        iov.setPointer(0, data);
        iov.setLong(8, Math.min(chunk, n - read));
        block.setPointer(16, iov);
        block.setLong(24, 1);
        block.setPointer(32, control);
        block.setLong(40, CONTROL_BYTES);
        towards(fd, deadlineNanos);
        long got = retryOnInterrupt(() -> recvmsg(fd, block, MSG_CMSG_CLOEXEC));
        if (got == 0) {
          throw new java.io.EOFException("the peer closed the take-over connection");
        }
        long controlLength = block.getLong(40);
        if (controlLength >= CMSG_HEADER && control.getInt(8) == SOL_SOCKET && control.getInt(12) == SCM_RIGHTS) {
          long count = (control.getLong(0) - CMSG_HEADER) / 4;
          for (int i = 0; i < count; i++) {
            fds.add(control.getInt(CMSG_HEADER + 4L * i));
          }
        }
        if ((block.getInt(48) & MSG_CTRUNC) != 0) {
          throw new IOException("descriptors were cut off (more than " + MAX_FDS_PER_FRAME + " in one frame)");
        }
        data.read(0, out, offset + read, (int) got);
        read += (int) got;
      }
    } finally {
      Reference.reachabilityFence(block);
    }
  }

  /**
   * Stops receiving on {@code fd}: from now on the peer's sends fail ({@code EPIPE}), while what
   * it sent before stays readable here. What lets a hand-over that gives up tell apart a Taken
   * that arrived in time (queued, read next) from one that did not (refused to the sender).
   */
  static void shutdownInput(int fd) throws IOException {
    call(() -> shutdown(fd, SHUT_RD));
  }

  /** A second descriptor of the same open file. */
  static int dupOf(int fd) throws IOException {
    return call(() -> dup(fd));
  }

  /** Wakes a thread blocked in accept or receive on {@code fd} (the number stays open). */
  static void shutdownQuietly(int fd) {
    try {
      shutdown(fd, SHUT_RDWR);
    } catch (LastErrorException e) {
      // not connected: nothing to wake
    }
  }

  static void closeQuietly(int fd) {
    if (fd < 0) {
      return;
    }
    try {
      close(fd);
    } catch (LastErrorException e) {
      // the number is released anyway on Linux
    }
  }
}
