package io.gpumemd.server;

import io.gpumemd.server.metrics.ReadinessCheck;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.function.IntSupplier;

/**
 * The daemon's answer to {@code /readyz}: ready while it serves, is not draining, its clients can
 * still reach it and its backend can still make memory. In that order, the first problem found
 * is the answer:
 *
 * <ol>
 *   <li><b>starting</b>: until every listener is up and the daemon has logged "gpumemd ready";
 *   <li><b>draining</b>: from SIGTERM (or {@link GpumemdServer#shutdown}) on, as the gRPC health
 *       service's NOT_SERVING; the pools and the backend close only at the end of the drain, so
 *       this also covers "every device pool open, the backend not closed";
 *   <li><b>a socket file gone or replaced</b> ({@link Listeners#socketProblem}): the gRPC socket
 *       and the fd channel's socket are how clients reach the daemon;
 *   <li><b>the host backend's shm directory gone</b>: every new segment is made in it (a files
 *       cleaner or systemd's {@code RemoveIPC=} emptying {@code /dev/shm} removes it), so misses
 *       would fail.
 * </ol>
 *
 * <p>What it does not see: a CUDA device that has failed under a running daemon (an Xid error, a
 * GPU fallen off the bus) is not probed here; leases on it fail with INTERNAL and the log says
 * why. Probing it would need a driver call per probe, which the backend does not offer yet.
 *
 * <p>Thread-safety: the state is volatile, set by the daemon's start and shutdown threads;
 * {@link #problem} runs on the metrics thread and only reads it and the file system.
 */
final class Readiness implements ReadinessCheck {
  private enum State { STARTING, SERVING, DRAINING, HANDED_OVER }

  private final Listeners listeners;
  private final Path shmRoot;
  private final IntSupplier liveLeases;
  private volatile State state = State.STARTING;
  private volatile int successorPid;

  /**
   * @param shmRoot the host backend's segment directory, or null for a backend without one
   * @param liveLeases the leases still held, for the draining message
   */
  Readiness(Listeners listeners, Path shmRoot, IntSupplier liveLeases) {
    this.listeners = listeners;
    this.shmRoot = shmRoot;
    this.liveLeases = liveLeases;
  }

  /** The daemon has started: every listener is up. */
  void serving() {
    if (state == State.STARTING) {
      state = State.SERVING;
    }
  }

  /** A successor took over (--take-over): this daemon serves nothing any more; for good. */
  void handedOver(int successorPid) {
    this.successorPid = successorPid;
    state = State.HANDED_OVER;
  }

  /** Shutdown has begun; for good. */
  void draining() {
    state = State.DRAINING;
  }

  @Override
  public String problem() {
    switch (state) {
      case STARTING:
        return "starting";
      case DRAINING:
        return "draining: shutting down, " + liveLeases.getAsInt() + " lease(s) still held";
      case HANDED_OVER:
        return "handed over to its successor (pid " + successorPid + "), which serves the socket now";
      default:
        break;
    }
    String socket = listeners.socketProblem();
    if (socket != null) {
      return socket;
    }
    if (shmRoot != null && !Files.isDirectory(shmRoot)) {
      return "host backend: shm directory " + shmRoot + " is gone: no new segment can be made";
    }
    return null;
  }
}
