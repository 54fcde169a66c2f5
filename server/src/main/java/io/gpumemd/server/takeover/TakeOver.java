package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.ErrnoCalls;
import io.gpumemd.proto.takeover.v1.Abort;
import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.Live;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.Taken;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import java.io.EOFException;
import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The successor's side of a take-over ({@code gpumemd --take-over}): asks the daemon behind the
 * take-over socket for its state, and tells it when the state is taken and when this daemon
 * serves. What {@link HandOver} describes, from the other end.
 *
 * <p>Outcomes of {@link #request}: the state (with the segments' descriptors, owned by the
 * returned object until restored); null when there is nobody to take over, or the running daemon
 * died before its state was complete (then this daemon starts fresh and says so); or an
 * IOException for a refusal, which leaves the running daemon serving and stops this one.
 *
 * <p>Not thread-safe: the starting thread uses it.
 */
public final class TakeOver implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(TakeOver.class);
  private static final int ENOENT = 2;
  private static final int EACCES = 13;
  private static final int ECONNREFUSED = 111;
  private static final int ECONNRESET = 104;
  private static final int EPIPE = 32;

  private final TakeOverChannel channel;
  private final State state;
  private List<Integer> fds;
  /** Indexes of {@link #fds} a restored pool took. */
  private final java.util.Set<Integer> consumed = new java.util.HashSet<>();
  private final int holderPid;
  /** The predecessor's pid as the kernel saw it at connect (0: in another PID namespace). */
  private final int peerPid;

  private TakeOver(TakeOverChannel channel, State state, List<Integer> fds, int peerPid) {
    this.peerPid = peerPid;
    this.channel = channel;
    this.state = state;
    this.fds = fds;
    this.holderPid = state.getPid();
  }

  /**
   * Asks the daemon behind {@code socket} for its state.
   *
   * @return the state, or null to start fresh (nobody there, or the daemon died mid-way)
   * @throws IOException when the running daemon refused, or cannot be asked (the message says why)
   */
  public static TakeOver request(Path socket, Hello hello) throws IOException {
    String path = socket.toAbsolutePath().toString();
    TakeOverChannel channel;
    try {
      channel = TakeOverChannel.connect(path, HandOver.HELLO_MILLIS + HandOver.QUIESCE_MILLIS);
    } catch (ErrnoCalls.ErrnoException e) {
      if (e.errno() == ENOENT || e.errno() == ECONNREFUSED) {
        log.info("--take-over: no daemon answers on {}; starting fresh", path);
        return null;
      }
      if (e.errno() == EACCES) {
        throw new IOException("take-over: cannot connect to " + path + ": permission denied (only the running "
            + "daemon's uid may take over: run as that user)");
      }
      throw new IOException("take-over: cannot connect to " + path + ": " + e.getMessage());
    }
    try {
      channel.send(TakeOverFrame.newBuilder().setHello(hello).build());
      long started = System.nanoTime();
      TakeOverFrame frame;
      try {
        frame = channel.receive();
      } catch (IOException e) {
        if (!gone(e)) {
          throw new IOException("take-over: the running daemon did not answer: " + e.getMessage());
        }
        log.warn("--take-over: the running daemon went away before its state was complete: starting fresh (the "
            + "sessions it held are gone; their memory went with it)");
        channel.close();
        return null;
      }
      if (frame.hasRefusal()) {
        throw new IOException("take-over refused by the running daemon (it serves on, untouched): "
            + frame.getRefusal().getReason());
      }
      if (!frame.hasState()) {
        throw new IOException("take-over: the running daemon answered " + frame.getFrameCase() + " instead of its state");
      }
      State state = frame.getState();
      List<Integer> fds = channel.takeFds();
      if (fds.size() != state.getDescriptorCount()) {
        fds.forEach(UnixSockets::closeQuietly);
        throw new IOException("take-over: " + fds.size() + " descriptor(s) came with a state that names "
            + state.getDescriptorCount());
      }
      log.info("--take-over: state of pid {} (gpumemd {}) received after {} ms: {} segment(s), {} bytes of books",
          state.getPid(), state.getVersion(), (System.nanoTime() - started) / 1_000_000,
          fds.size(), state.getSerializedSize());
      int peerPid;
      try {
        peerPid = channel.peer()[0];
      } catch (IOException e) {
        peerPid = 0;
      }
      return new TakeOver(channel, state, fds, peerPid);
    } catch (IOException | RuntimeException e) {
      channel.close();
      throw e;
    }
  }

  /** The peer closed or reset the connection (it died), as opposed to a timeout or a bad frame. */
  private static boolean gone(IOException e) {
    return e instanceof EOFException
        || e instanceof ErrnoCalls.ErrnoException errno && (errno.errno() == ECONNRESET || errno.errno() == EPIPE);
  }

  public State state() {
    return state;
  }

  /** The segments' descriptors, by the state's descriptor indexes; the restored pools take them. */
  public List<Integer> fds() {
    return java.util.Collections.unmodifiableList(fds);
  }

  /** A restored pool took these descriptors (by index), whatever became of it: close them no more. */
  public void consumed(int[] indexes) {
    for (int i : indexes) {
      if (i >= 0 && i < fds.size()) {
        consumed.add(i);
      }
    }
  }

  public int holderPid() {
    return holderPid;
  }

  /** Restoring failed: the running daemon serves on. */
  public void abort(String reason) {
    try {
      channel.send(TakeOverFrame.newBuilder().setAbort(Abort.newBuilder().setReason(reason)).build());
    } catch (IOException e) {
      log.warn("--take-over: could not tell the running daemon that restoring failed ({})", e.getMessage());
    }
  }

  /**
   * The state is this daemon's now. A predecessor that died after sending it cannot be told, and
   * need not be: the memory is this daemon's either way. One that cannot be told but still runs
   * (it gave up waiting) may serve again: then this daemon must not.
   *
   * @throws IOException when the predecessor still runs but did not take the message
   */
  public void taken() throws IOException {
    try {
      channel.send(TakeOverFrame.newBuilder().setTaken(Taken.getDefaultInstance()).build());
    } catch (IOException e) {
      // SO_PEERCRED's pid is 0 where the predecessor's PID namespace is not this one's: then
      // only a dead predecessor closes the connection before Taken (it waits minutes for it).
      int pid = peerPid;
      if (pid > 0 && ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
        throw new IOException("take-over: the previous daemon (pid " + pid + ") still runs but did not take the "
            + "state back (" + e.getMessage() + "); this daemon does not serve its memory");
      }
      log.warn("--take-over: the previous daemon (pid {}) went away after sending its state; carrying on with it",
          holderPid);
    }
  }

  /** This daemon serves on the socket path: the predecessor may stop. */
  public void live() {
    try {
      channel.send(TakeOverFrame.newBuilder().setLive(Live.getDefaultInstance()).build());
    } catch (IOException e) {
      // it stops anyway once it has seen Taken
    }
  }

  @Override
  public void close() {
    for (int i = 0; i < fds.size(); i++) {
      if (!consumed.contains(i)) {
        UnixSockets.closeQuietly(fds.get(i));
      }
    }
    fds = List.of();
    channel.close();
  }
}
