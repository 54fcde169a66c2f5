package io.gpumemd.server.fd;

import io.gpumemd.common.unix.Pidfd;
import io.gpumemd.common.unix.ProcessStat;
import io.gpumemd.server.pool.DescriptorHolder;

/**
 * A process that connected to the fd channel, as {@link DescriptorPins} knows it until it has
 * exited: its connections, its grants on their way into the books, and how it is followed.
 * Guarded by the {@link DescriptorPins} that holds it, except {@link #exited}, which reads
 * {@code /proc} or polls its pidfd and is called outside that lock.
 */
final class FdPeer {
  /**
   * A process as its holders name it ({@link DescriptorHolder}): a pid and its start time, or for
   * a process this daemon cannot see by pid, pid 0 and its pidfs inode.
   */
  record Key(int pid, long start) {}

  final Key key;
  /** How a process this daemon cannot see by pid is followed; null for the others. */
  final Pidfd pidfd;
  final String tenant;
  int connections;
  /** The value of {@code DescriptorPins.connects} when it last connected: a check begun before is stale. */
  long lastConnect;
  /** A connection of it ended with replies unread: it keeps what it was sent until it exits. */
  boolean leftUnread;
  /** Grants on their way into the pool's books: the process is not forgotten meanwhile. */
  int granting;

  FdPeer(Key key, Pidfd pidfd, String tenant) {
    this.key = key;
    this.pidfd = pidfd;
    this.tenant = tenant;
  }

  /** Whether the process has exited (or its pid names a later process). Reads /proc or polls: outside the lock. */
  boolean exited() {
    return pidfd != null ? pidfd.exited() : gone(key);
  }

  /** Whether a process followed by pid has exited, or its pid names a later process. */
  static boolean gone(Key process) {
    ProcessStat stat = ProcessStat.read(process.pid());
    return !stat.alive() || stat.startTicks() != process.start();
  }
}
