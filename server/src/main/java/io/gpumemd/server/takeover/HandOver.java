package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.Abort;
import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.Refusal;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.pool.TakeOverRefusedException;
import java.io.EOFException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The running daemon's side of a take-over: listens on the take-over socket (mode 0600, and the
 * peer's uid checked against the daemon's own with SO_PEERCRED), and hands its state to one
 * successor at a time:
 *
 * <ol>
 *   <li>reads the successor's {@link Hello} and refuses a configuration that cannot hold the
 *       state ({@link Daemon#refusal}), changing nothing;
 *   <li>closes the {@link HandOverGate} and waits for the requests in progress: from here no
 *       request is applied, so the state sent is exactly the state served;
 *   <li>sends every segment's descriptor and the books ({@link Daemon#exportState});
 *   <li>on {@code Abort}, or when the successor goes away, opens the gate and serves on as if
 *       nothing happened (its descriptors were copies); a successor that does not answer within
 *       {@link #ANSWER_MILLIS} of the state (silent, stuck or hostile) is given up: the gate
 *       reopens with a WARN, and the successor is told so by a {@code Refusal} before the
 *       connection closes ({@link #giveUp}), which is what lets a successor tell a holder that
 *       gave up from one that died;
 *   <li>on {@code Taken} the memory is the successor's: it waits for {@code Live} (the successor
 *       serves on the socket path) and stops for good without freeing memory ({@link
 *       Daemon#handedOver}).
 * </ol>
 *
 * <p>One thread ({@code gpumemd-handover}) runs it; {@link #close} stops it from any thread.
 */
public final class HandOver implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(HandOver.class);
  /** How long requests in progress may take to finish once the gate closes. */
  static final long QUIESCE_MILLIS = 5_000;
  /** How long the successor may take to say who it is, and to restore the state. */
  static final long HELLO_MILLIS = 10_000;
  /**
   * How long the gate stays closed for a successor once the state is exported: its sends must
   * progress and its answer (Taken or Abort) must come within this, else the hand-over is given
   * up and the daemon serves on. Restoring takes milliseconds (41 ms for 130 leases): 10 s leave
   * a loaded node a wide margin, while a silent peer holds every call UNAVAILABLE only that long.
   */
  static final long ANSWER_MILLIS = 10_000;
  /** How long the successor may take from Taken to serving on the socket path. */
  static final long LIVE_MILLIS = 15_000;

  /** What the hand-over needs of the running daemon. */
  public interface Daemon {
    /** Null when a successor so configured can hold this daemon's state, else why not. */
    String refusal(Hello hello);

    /**
     * The state, with the gate closed; adds one descriptor per segment to {@code descriptors}
     * (copies the caller closes once sent, or refused).
     */
    State exportState(List<SegmentFd> descriptors) throws TakeOverRefusedException;

    /** The successor owns the state now: stop serving for good, freeing no memory. Returns at once. */
    void handedOver(int successorPid);
  }

  private final Path path;
  private final HandOverGate gate;
  private final Daemon daemon;
  private final String version;
  private final int uid;
  private final int listening;
  private final Thread thread;
  private volatile boolean closed;
  private volatile boolean done;
  /** The socket file at {@link #path} once published (device and inode): removed at close only if still there. */
  private Object fileKey;

  /**
   * Binds the take-over socket at {@code bindAt} (a successor binds a temporary path and
   * renames it over the predecessor's, {@link #publishAt}), and starts listening.
   */
  public HandOver(Path path, Path bindAt, HandOverGate gate, Daemon daemon, String version) throws IOException {
    this.path = path.toAbsolutePath();
    this.gate = gate;
    this.daemon = daemon;
    this.version = version;
    this.uid = (int) new com.sun.security.auth.module.UnixSystem().getUid();
    Files.createDirectories(this.path.getParent());
    Path at = bindAt.toAbsolutePath();
    Files.deleteIfExists(at);
    this.listening = UnixSockets.listen(at.toString());
    try {
      Files.setPosixFilePermissions(at, PosixFilePermissions.fromString("rw-------"));
    } catch (IOException e) {
      UnixSockets.closeQuietly(listening);
      throw e;
    }
    this.thread = new Thread(this::serve, "gpumemd-handover");
    thread.setDaemon(true);
  }

  /**
   * Removes a stale take-over socket at {@code path}: one no daemon answers on (left by one that
   * died). A live one is another daemon's.
   *
   * @throws IOException when a daemon answers there
   */
  public static void clearStale(Path path) throws IOException {
    if (!Files.exists(path, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
      return;
    }
    try {
      UnixSockets.closeQuietly(UnixSockets.connect(path.toAbsolutePath().toString()));
    } catch (IOException e) {
      Files.deleteIfExists(path);
      return;
    }
    throw new IOException("take-over socket " + path + " is in use by a running gpumemd (expected: a free path; "
        + "start with --take-over to take that daemon's place)");
  }

  /** Moves the socket bound at a temporary path to {@code path} (atomically replacing a predecessor's). */
  public static void publishAt(Path bindAt, Path path) throws IOException {
    Files.move(bindAt.toAbsolutePath(), path.toAbsolutePath(), StandardCopyOption.ATOMIC_MOVE,
        StandardCopyOption.REPLACE_EXISTING);
  }

  /** Starts serving; the socket must be at its path by now ({@link #publishAt}). */
  public void start() throws IOException {
    fileKey = Files.readAttributes(path, java.nio.file.attribute.BasicFileAttributes.class,
        java.nio.file.LinkOption.NOFOLLOW_LINKS).fileKey();
    thread.start();
    log.info("Take-over socket on unix://{} (a successor started with --take-over and this uid takes over here)",
        path);
  }

  /** True once a successor has taken over. */
  public boolean handedOver() {
    return done;
  }

  private void serve() {
    while (!closed && !done) {
      int fd;
      try {
        fd = UnixSockets.accept(listening);
      } catch (IOException e) {
        if (!closed) {
          log.error("Take-over socket {} failed; take-overs are no longer possible: {}", path, e.getMessage());
        }
        return;
      }
      try (TakeOverChannel channel = new TakeOverChannel(fd)) {
        handle(channel);
      } catch (RuntimeException | Error e) {
        if (done) {
          log.error("Stopping after the hand-over failed unexpectedly", e);
        } else {
          log.error("Take-over failed unexpectedly; serving on", e);
          gate.open();
        }
      }
    }
  }

  private void handle(TakeOverChannel channel) {
    int[] peer;
    Hello hello;
    try {
      peer = channel.peer();
      channel.timeout(HELLO_MILLIS);
      if (peer[1] != uid) {
        log.warn("Take-over refused: pid {} runs as uid {}, and only this daemon's uid {} may take over", peer[0],
            peer[1], uid);
        refuse(channel, "the take-over socket serves only uid " + uid + " (the daemon's own); this process runs as uid "
            + peer[1]);
        return;
      }
      TakeOverFrame first = channel.receiveFromTaker();
      if (!first.hasHello()) {
        log.warn("Take-over refused: pid {} did not start with a Hello", peer[0]);
        return;
      }
      hello = first.getHello();
    } catch (IOException e) {
      log.warn("Take-over attempt ended before it began: {}", e.getMessage());
      return;
    }
    String refusal = daemon.refusal(hello);
    if (refusal != null) {
      log.warn("Take-over by pid {} (gpumemd {}) refused: {}; serving on", peer[0], hello.getVersion(), refusal);
      refuse(channel, refusal);
      return;
    }
    if (closed) {
      refuse(channel, "this daemon is shutting down");
      return;
    }
    log.info("Take-over asked by pid {} (gpumemd {}): no longer applying requests", peer[0], hello.getVersion());
    long started = System.nanoTime();
    int left;
    try {
      left = gate.close(QUIESCE_MILLIS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      gate.open();
      return;
    }
    if (left > 0) {
      gate.open();
      String reason = left + " request(s) still running after " + QUIESCE_MILLIS + " ms; try again";
      log.warn("Take-over by pid {} refused: {}; serving on", peer[0], reason);
      refuse(channel, reason);
      return;
    }
    List<SegmentFd> descriptors = new ArrayList<>();
    try {
      State state;
      try {
        state = daemon.exportState(descriptors);
      } catch (TakeOverRefusedException | RuntimeException e) {
        gate.open();
        String reason = e instanceof TakeOverRefusedException ? e.getMessage()
            : "the state could not be exported (" + e.getMessage() + ")";
        if (e instanceof RuntimeException) {
          log.error("Exporting the state for a take-over failed", e);
        }
        log.warn("Take-over by pid {} refused: {}; serving on", peer[0], reason);
        refuse(channel, reason);
        return;
      }
      // One bound for the whole rest, however the successor paces its reads and its answer.
      channel.deadline(System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ANSWER_MILLIS));
      List<Integer> fds = descriptors.stream().map(SegmentFd::number).toList();
      channel.sendFds(fds);
      channel.send(TakeOverFrame.newBuilder().setState(state.toBuilder().setDescriptorCount(fds.size())
          .setVersion(version).setPid((int) ProcessHandle.current().pid())).build());
      log.info("State sent to pid {}: {} segment descriptor(s), {} bytes of books, after {} ms", peer[0],
          fds.size(), state.getSerializedSize(),
          (System.nanoTime() - started) / 1_000_000);
    } catch (IOException e) {
      gate.open();
      log.warn("Take-over by pid {} failed while sending the state ({}); serving on", peer[0], e.getMessage());
      return;
    } finally {
      for (SegmentFd d : descriptors) {
        try {
          d.close();
        } catch (IOException e) {
          log.warn("Cannot close a sent segment descriptor: {}", e.toString());
        }
      }
    }
    TakeOverFrame answer;
    try {
      // From here the successor may hold the whole state: any way out but its Taken goes
      // through giveUp, which tells it (see there). Still by the deadline set before the state.
      answer = channel.receiveFromTaker();
    } catch (EOFException e) {
      gate.open();
      log.warn("Take-over by pid {} failed: it went away before taking the state (connection closed); serving on",
          peer[0]);
      return;
    } catch (IOException e) {
      String why = TakeOverChannel.timedOut(e)
          ? "no answer within " + ANSWER_MILLIS + " ms of the state" : "a broken answer (" + e.getMessage() + ")";
      answer = giveUp(channel, peer[0], why);
      if (answer == null) {
        return;
      }
    }
    if (!answer.hasTaken()) {
      gate.open();
      Abort abort = answer.getAbort();
      log.warn("Take-over by pid {} failed: it could not restore the state ({}); serving on", peer[0],
          answer.hasAbort() ? abort.getReason() : "unexpected answer");
      if (!answer.hasAbort()) {
        // Never close before Taken without saying so (see giveUp).
        refuse(channel, "the running daemon expected Taken or Abort, not " + answer.getFrameCase() + ", and serves on");
      }
      return;
    }
    done = true;
    log.info("Handed over to pid {} after {} ms: its state is the successor's now", peer[0],
        (System.nanoTime() - started) / 1_000_000);
    try {
      channel.timeout(LIVE_MILLIS);
      TakeOverFrame live = channel.receiveFromTaker();
      if (!live.hasLive()) {
        log.warn("The successor (pid {}) answered {} instead of Live", peer[0], live.getFrameCase());
      }
    } catch (IOException e) {
      log.warn("The successor (pid {}) did not say it serves ({}); stopping anyway: the state is its own",
          peer[0], e.getMessage());
    }
    daemon.handedOver(peer[0]);
  }

  /**
   * Gives up a hand-over whose state was sent: stops hearing the successor, honours a Taken it
   * queued in time (the memory is its own then), else reopens the gate (WARN) and tells it so
   * with a Refusal before the connection closes. The order is the protocol's guarantee to the
   * successor ({@link TakeOver#taken}): once input is shut, its Taken fails with EPIPE instead of
   * going unread, and the connection never closes without that Refusal first, so a successor
   * that finds it closed without one knows this daemon is gone. (Only a successor that leaves its
   * state unread for {@link #LIVE_MILLIS} more can miss the Refusal.)
   *
   * @return the Taken that came in time, or null: this daemon serves on
   */
  private TakeOverFrame giveUp(TakeOverChannel channel, int pid, String why) {
    try {
      channel.shutdownInput();
      // Past the deadline now: what is queued is read at once, the Refusal below may wait.
      channel.timeout(LIVE_MILLIS);
      // Input is shut: what is queued can be read, then EOF at once; nothing more comes.
      while (true) {
        TakeOverFrame queued = channel.receiveFromTaker();
        if (queued.hasTaken()) {
          log.info("Take-over by pid {}: its Taken came as the wait ended; handing over", pid);
          return queued;
        }
      }
    } catch (IOException e) {
      // EOF after the queue, or a broken frame: no Taken came
    }
    gate.open();
    log.warn("Take-over by pid {} given up: {}; the gate is open again and this daemon serves on", pid, why);
    refuse(channel, "the running daemon gave the take-over up (" + why + ") and serves on");
    return null;
  }

  private static void refuse(TakeOverChannel channel, String reason) {
    try {
      channel.send(TakeOverFrame.newBuilder().setRefusal(Refusal.newBuilder().setReason(reason)).build());
    } catch (IOException e) {
      // the peer is gone; it learns nothing either way
    }
  }

  /**
   * Stops listening, and waits for a hand-over in progress to end (a shutdown must not drain
   * sessions a successor is taking); removes the socket file if it is still this daemon's.
   */
  @Override
  public void close() {
    closed = true;
    UnixSockets.shutdownQuietly(listening);
    if (Thread.currentThread() != thread && thread.isAlive()) {
      try {
        thread.join(QUIESCE_MILLIS + 2 * ANSWER_MILLIS + 2 * LIVE_MILLIS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    UnixSockets.closeQuietly(listening);
    try {
      // A successor replaced the file with its own: leave that one alone.
      if (fileKey != null && fileKey.equals(Files.readAttributes(path,
          java.nio.file.attribute.BasicFileAttributes.class, java.nio.file.LinkOption.NOFOLLOW_LINKS).fileKey())) {
        Files.deleteIfExists(path);
      }
    } catch (IOException e) {
      // gone already
    }
  }
}
