package io.gpumemd.common.unix;

import static io.gpumemd.common.unix.ErrnoCalls.call;
import static io.gpumemd.common.unix.ErrnoCalls.retryOnInterrupt;
import static io.gpumemd.common.unix.Libc.AF_UNIX;
import static io.gpumemd.common.unix.Libc.SOCK_CLOEXEC;
import static io.gpumemd.common.unix.Libc.SOCK_STREAM;
import static io.gpumemd.common.unix.Libc.SOL_SOCKET;
import static io.gpumemd.common.unix.Libc.SUN_PATH_MAX;

import com.sun.jna.LastErrorException;
import com.sun.jna.Memory;
import java.io.EOFException;
import java.io.IOException;
import java.lang.ref.Reference;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.List;

/**
 * Blocking Unix stream sockets that pass descriptors, the calls the JDK lacks: connect and
 * listen by path, send and receive with {@code SCM_RIGHTS} ({@link MessageBuffer}), the peer's
 * credentials ({@code SO_PEERCRED}), whether the peer has read everything ({@code SIOCOUTQ}), timeouts
 * and shutdown. What the client's fd channel, the daemon's fd channel and the take-over share; a
 * failed call is an {@link ErrnoCalls.ErrnoException} carrying its errno.
 *
 * <p>Linux on a 64-bit architecture only ({@link UnsupportedPlatformException} elsewhere).
 *
 * <p>Stateless and thread-safe; each call's native buffers are its own.
 */
public final class UnixSockets {
  /** Most descriptors one frame of {@link #send} carries (the kernel's SCM_MAX_FD is 253). */
  public static final int MAX_FDS_PER_FRAME = 200;
  /** The most bytes one {@code recvmsg} of {@link #receive} reads: the native buffer of a receive. */
  public static final int MAX_CHUNK_BYTES = 1 << 20;

  private UnixSockets() {}

  /**
   * Binds the native calls.
   *
   * @throws UnsupportedPlatformException anywhere but 64-bit Linux
   */
  public static void check() throws UnsupportedPlatformException {
    Libc.bind();
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

  /** A listening socket (close-on-exec) bound at {@code path}, which must not exist. */
  public static int listen(String path) throws IOException {
    check();
    Memory address = address(path);
    int fd = call(() -> Libc.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    try {
      call(() -> Libc.bind(fd, address, 2 + SUN_PATH_MAX));
      call(() -> Libc.listen(fd, 4));
      return fd;
    } catch (IOException e) {
      closeQuietly(fd);
      throw e;
    } finally {
      Reference.reachabilityFence(address);
    }
  }

  /** Waits for a connection (close-on-exec); {@link #shutdownQuietly} of the listening socket ends the wait with an IOException. */
  public static int accept(int listening) throws IOException {
    return (int) retryOnInterrupt(() -> Libc.accept4(listening, null, null, SOCK_CLOEXEC));
  }

  /** A socket (close-on-exec) connected to {@code path}. */
  public static int connect(String path) throws IOException {
    return connect(path, 0);
  }

  /**
   * A socket (close-on-exec) connected to {@code path}, with every send and receive bounded by
   * {@code timeoutMillis} (0: none); the send timeout also bounds the connect to a socket whose
   * backlog is full.
   */
  public static int connect(String path, long timeoutMillis) throws IOException {
    check();
    Memory address = address(path);
    int fd = call(() -> Libc.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    try {
      if (timeoutMillis > 0) {
        timeouts(fd, timeoutMillis);
      }
      call(() -> Libc.connect(fd, address, 2 + SUN_PATH_MAX));
      return fd;
    } catch (IOException | RuntimeException e) {
      closeQuietly(fd);
      throw e;
    } finally {
      Reference.reachabilityFence(address);
    }
  }

  /** Bounds every later send and receive on {@code fd} ({@code SO_SNDTIMEO}, {@code SO_RCVTIMEO}; 0 = wait forever). */
  public static void timeouts(int fd, long millis) throws IOException {
    try (Memory timeval = new Memory(16)) {
      timeval.setLong(0, millis / 1000);
      timeval.setLong(8, (millis % 1000) * 1000);
      call(() -> Libc.setsockopt(fd, SOL_SOCKET, Libc.SO_RCVTIMEO, timeval, 16));
      call(() -> Libc.setsockopt(fd, SOL_SOCKET, Libc.SO_SNDTIMEO, timeval, 16));
    }
  }

  /** The peer's {pid, uid, gid} as the kernel recorded them at connect ({@code SO_PEERCRED}). */
  public static int[] peerCredentials(int fd) throws IOException {
    check();
    try (Memory ucred = new Memory(12); Memory length = new Memory(4)) {
      length.setInt(0, 12);
      call(() -> Libc.getsockopt(fd, SOL_SOCKET, Libc.SO_PEERCRED, ucred, length));
      return new int[] {ucred.getInt(0), ucred.getInt(4), ucred.getInt(8)};
    }
  }

  /**
   * What the kernel still holds of the sends on {@code fd} ({@code SIOCOUTQ}): on a Unix stream
   * socket the memory of the messages waiting unread in the peer's queue (their buffers' size,
   * not a byte count), 0 once the peer has read everything or closed its socket.
   */
  public static int queuedForPeer(int fd) throws IOException {
    check();
    int[] queued = new int[1];
    call(() -> Libc.ioctl(fd, Libc.SIOCOUTQ, queued));
    return queued[0];
  }

  /**
   * Bytes waiting to be read on {@code fd} ({@code FIONREAD}): what a read would take now without
   * waiting, 0 when none.
   */
  public static int readable(int fd) throws IOException {
    check();
    int[] waiting = new int[1];
    call(() -> Libc.ioctl(fd, Libc.FIONREAD, waiting));
    return waiting[0];
  }

  /** The deadline of a send or receive passed (see {@link #send}). */
  public static final class DeadlinePassed extends IOException {
    private static final long serialVersionUID = 1L;

    DeadlinePassed() {
      super("the peer did not keep up within the deadline");
    }
  }

  /**
   * Before each {@code sendmsg}/{@code recvmsg} of one send or receive: with a deadline ({@code
   * System.nanoTime()} based, 0 for none), the socket's timeouts become what is left of it, so a
   * peer that trickles a byte at a time cannot stretch the whole beyond it.
   */
  private static MessageBuffer.DeadlineCheck towards(int fd, long deadlineNanos) {
    if (deadlineNanos == 0) {
      return null;
    }
    return () -> {
      long left = deadlineNanos - System.nanoTime();
      if (left <= 0) {
        throw new DeadlinePassed();
      }
      timeouts(fd, Math.max(1, left / 1_000_000));
    };
  }

  public static void send(int fd, byte[] bytes, List<Integer> fds) throws IOException {
    send(fd, bytes, fds, 0);
  }

  /**
   * Sends all of {@code bytes}, with {@code fds} attached to the first byte (at most {@link
   * #MAX_FDS_PER_FRAME}), by {@code deadlineNanos} if not 0.
   */
  public static void send(int fd, byte[] bytes, List<Integer> fds, long deadlineNanos) throws IOException {
    if (fds.size() > MAX_FDS_PER_FRAME) {
      throw new IllegalArgumentException(fds.size() + " descriptors in one frame");
    }
    try (MessageBuffer buffer = new MessageBuffer(Math.max(1, bytes.length), MAX_FDS_PER_FRAME)) {
      buffer.sendAll(fd, bytes, 0, bytes.length, fds, towards(fd, deadlineNanos));
    }
  }

  /**
   * Reads exactly {@code n} bytes into {@code out} from {@code offset}; descriptors that arrive
   * with them are appended to {@code fds} (received close-on-exec). The native buffer is at most
   * {@link #MAX_CHUNK_BYTES} whatever {@code n} is: a caller reads a large frame chunk by chunk
   * and grows its array only as bytes really arrive.
   *
   * @throws EOFException when the peer closed first
   */
  public static void receive(int fd, byte[] out, int offset, int n, ArrayDeque<Integer> fds) throws IOException {
    receive(fd, out, offset, n, fds, 0);
  }

  /** {@link #receive(int, byte[], int, int, ArrayDeque)} by {@code deadlineNanos} if not 0. */
  public static void receive(int fd, byte[] out, int offset, int n, ArrayDeque<Integer> fds, long deadlineNanos)
      throws IOException {
    MessageBuffer.DeadlineCheck deadline = towards(fd, deadlineNanos);
    try (MessageBuffer buffer = new MessageBuffer(Math.max(1, Math.min(n, MAX_CHUNK_BYTES)), MAX_FDS_PER_FRAME)) {
      int read = 0;
      while (read < n) {
        if (deadline != null) {
          deadline.check();
        }
        int got = buffer.receive(fd, out, offset + read, n - read, fds::add);
        if (got == 0) {
          throw new EOFException("the peer closed the connection");
        }
        read += got;
      }
    }
  }

  /**
   * Stops receiving on {@code fd}: from now on the peer's sends fail ({@code EPIPE}), while what
   * it sent before stays readable here.
   */
  public static void shutdownInput(int fd) throws IOException {
    call(() -> Libc.shutdown(fd, Libc.SHUT_RD));
  }

  /** A second descriptor of the same open file. */
  public static int dupOf(int fd) throws IOException {
    return Descriptors.dup(fd);
  }

  /** Wakes a thread blocked in accept or receive on {@code fd} (the number stays open). */
  public static void shutdownQuietly(int fd) {
    try {
      Libc.shutdown(fd, Libc.SHUT_RDWR);
    } catch (LastErrorException e) {
      // not connected: nothing to wake
    }
  }

  /** Closes a number; one below 0 is none. */
  public static void closeQuietly(int fd) {
    Descriptors.closeQuietly(fd);
  }

  /**
   * Whether {@code name} is a plain file name, to be looked for beside a known socket: one path
   * element, not {@code .} or {@code ..}, of printable ASCII, at most 255 bytes (a successor's
   * socket name, which the daemon passes on and its clients resolve; both check it here).
   */
  public static boolean isSocketFileName(String name) {
    return !name.isEmpty() && name.length() <= 255 && !name.equals(".") && !name.equals("..")
        && name.chars().allMatch(c -> c > 0x20 && c < 0x7f && c != '/');
  }
}
