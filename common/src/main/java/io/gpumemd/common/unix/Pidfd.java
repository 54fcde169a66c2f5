package io.gpumemd.common.unix;

import static io.gpumemd.common.unix.ErrnoCalls.call;

import com.sun.jna.Memory;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * A process held by a pidfd: it names the process in any PID namespace, a pid the daemon cannot
 * see included (where {@code SO_PEERCRED} says 0), and tells when the process has exited, which no
 * later process reusing its pid can fake. Only pidfds on pidfs (Linux 6.9) are made: there each
 * process has an inode of its own for as long as the system runs, so two connections of one
 * process are known as one ({@link #inode}); older kernels give every pidfd the same anonymous
 * inode, and then {@link #ofPeer} says null.
 *
 * <p>Thread-safety: {@link #exited} may be called from any thread until {@link #close}; closing
 * is the owner's, once, after its last use.
 */
public final class Pidfd implements AutoCloseable {
  /** {@code ENOPROTOOPT}: the kernel has no {@code SO_PEERPIDFD} (before Linux 6.5). */
  private static final int ENOPROTOOPT = 92;

  private final int fd;
  private final long inode;

  private Pidfd(int fd, long inode) {
    this.fd = fd;
    this.inode = inode;
  }

  /**
   * The pidfd of the process at the other end of a connected Unix socket, as the kernel recorded
   * it at connect ({@code SO_PEERPIDFD}); null where this kernel cannot name processes by pidfd
   * (before Linux 6.5 no such option; before 6.9 no pidfs).
   *
   * @throws IOException when the kernel refuses for another reason (out of descriptors: {@link
   *     ErrnoCalls.ErrnoException#outOfDescriptors})
   */
  public static Pidfd ofPeer(int socket) throws IOException {
    UnixSockets.check();
    int fd;
    try (Memory value = new Memory(4); Memory length = new Memory(4)) {
      length.setInt(0, 4);
      try {
        call(() -> Libc.getsockopt(socket, Libc.SOL_SOCKET, Libc.SO_PEERPIDFD, value, length));
      } catch (ErrnoCalls.ErrnoException e) {
        if (e.errno() == ENOPROTOOPT) {
          return null;
        }
        throw e;
      }
      fd = value.getInt(0);
    }
    return onPidfs(fd, -1);
  }

  /**
   * Takes a descriptor said to be the pidfd of the process with pidfs inode {@code inode} (one
   * another process sent, as a take-over's running daemon does): null, the descriptor closed,
   * when it is not.
   *
   * @throws IOException when the kernel cannot say what it is (the descriptor is closed)
   */
  public static Pidfd adopt(int fd, long inode) throws IOException {
    return onPidfs(fd, inode);
  }

  /** {@code fd} as a Pidfd when it is a pidfd on pidfs (of {@code inode}, unless -1); else null, and it is closed. */
  private static Pidfd onPidfs(int fd, long inode) throws IOException {
    try (Memory statfs = new Memory(Libc.STATFS)) {
      Libc.bind();
      call(() -> Libc.fstatfs(fd, statfs));
      long own = statfs.getLong(0) == Libc.PIDFS_MAGIC
          ? (Long) Files.getAttribute(Path.of("/proc/self/fd/" + fd), "unix:ino") : -1;
      if (own < 0 || (inode >= 0 && own != inode)) {
        UnixSockets.closeQuietly(fd);
        return null;
      }
      return new Pidfd(fd, own);
    } catch (IOException | RuntimeException | LinkageError e) {
      UnixSockets.closeQuietly(fd);
      throw e;
    }
  }

  /** A second descriptor of this pidfd, the caller's to close (what a take-over sends). */
  public int copy() throws IOException {
    return Descriptors.dup(fd);
  }

  /** The process's pidfs inode: the same for every pidfd of one process, another for any other process. */
  public long inode() {
    return inode;
  }

  /**
   * Whether the process has exited (a zombie included: its memory and descriptors are gone). A
   * pidfd polls readable from its exit on; this never blocks.
   */
  public boolean exited() {
    try (Memory pollfd = new Memory(Libc.POLLFD)) {
      pollfd.setInt(0, fd);
      pollfd.setShort(4, Libc.POLLIN);
      pollfd.setShort(6, (short) 0);
      int ready = (int) ErrnoCalls.retryOnInterrupt(() -> Libc.poll(pollfd, 1, 0));
      return ready > 0 && (pollfd.getShort(6) & (Libc.POLLIN | Libc.POLLHUP)) != 0;
    } catch (IOException e) {
      return false; // the kernel did not say: the process keeps what it holds
    }
  }

  @Override
  public void close() {
    UnixSockets.closeQuietly(fd);
  }

  @Override
  public String toString() {
    return "pidfd inode " + inode;
  }
}
