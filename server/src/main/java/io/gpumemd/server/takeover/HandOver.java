package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.server.pool.SegmentAhead;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The running daemon's side of a take-over (handing over; {@link TakeOver} is the successor's,
 * taking over): listens on the take-over socket (mode 0600, and the peer's uid checked against
 * the daemon's own with SO_PEERCRED), and hands its state to one successor at a time, each
 * connection one {@link HandOverAttempt} through these steps:
 *
 * <ol>
 *   <li>reads the successor's {@link Hello} and refuses a configuration that cannot hold the
 *       state ({@link Daemon#refusal}), changing nothing;
 *   <li>where the Hello takes them, sends every segment's descriptor ahead ({@link
 *       Daemon#segmentsAhead}) while it serves on, and waits for the successor's {@code Ready}
 *       (it has adopted them) within {@link #ANSWER_MILLIS}; anything else, and it serves on;
 *   <li>where the Hello takes them too, writes the books down with the gate closed for just that
 *       long, opens it, and sends them ahead while it serves on ({@code state_ahead}), waiting
 *       for the successor's {@code Ready} (it has read them) as for the segments;
 *   <li>closes the {@link HandOverGate} and waits for the requests in progress: from here no
 *       request is applied, so the state sent is exactly the state served;
 *   <li>sends the descriptors of segments not sent before and the books ({@link Daemon#write}):
 *       whole, or after books sent ahead only what changed since ({@link StateChanges});
 *   <li>on {@code Abort}, or when the successor goes away, opens the gate and serves on as if
 *       nothing happened (its descriptors were copies); a successor that does not answer within
 *       {@link #ANSWER_MILLIS} of the state (silent, stuck or hostile) is given up: the gate
 *       reopens with a WARN, and the successor is told so by a {@code Refusal} before the
 *       connection closes ({@link HandOverAttempt#giveUp}), which is what lets a successor tell a
 *       running daemon that gave up from one that died;
 *   <li>on {@code Taken} the memory is the successor's: it waits for {@code Live} (the successor
 *       serves on the socket path) and stops for good without freeing memory ({@link
 *       Daemon#handedOver}).
 * </ol>
 *
 * <p>One thread ({@code gpumemd-handover}) runs it; {@link #close} stops it from any thread. The
 * timeouts of the protocol are here, for both sides.
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

  /** What the hand-over needs of the running daemon ({@link TakeOverState.RunningDaemon}). */
  public interface Daemon {
    /** Null when a successor so configured can hold this daemon's state, else why not. */
    String refusal(Hello hello);

    /**
     * Every segment's descriptor, to send ahead of the state while this daemon still serves
     * (copies the caller closes once sent). Empty where there are none to send.
     */
    default List<SegmentAhead> segmentsAhead() {
      return List.of();
    }

    /**
     * The books, written with the gate closed ({@link TakeOverState#write}); a segment whose
     * descriptor was sent before is named by its index in {@code descriptors}, the others' copies
     * are added there.
     */
    TakeOverState.Books write(OutgoingDescriptors descriptors) throws TakeOverRefusedException;

    /**
     * With the gate closed, for the last state only: copies of the pidfds of processes this daemon
     * cannot see, added to {@code descriptors} after the segments'; their pidfs inodes in order.
     */
    default List<Long> hiddenProcesses(OutgoingDescriptors descriptors) throws TakeOverRefusedException {
      return List.of();
    }

    /** The successor owns the state now: stop serving for good, freeing no memory. Returns at once. */
    void handedOver(int successorPid);

    /**
     * Runs what the state's way out runs, on scratch books, while this daemon still serves: a
     * successor's Hello was accepted and the gate closes next, so the pause meets warm code.
     */
    default void rehearse() {}

    /**
     * A successor's Hello was accepted: tells the clients where it listens until it serves on
     * this daemon's socket ({@code Hello.serving_at}, a file name beside it), so that they
     * connect there while this daemon still serves. Returns at once.
     */
    default void successorAt(String socketName) {}

    /**
     * The successor whose socket {@link #successorAt} named went away without taking over: tells
     * the clients to drop the connection they made to it. Returns at once.
     */
    default void successorGone() {}
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
  /** Set by the first {@link #close}: only it releases the socket (a number closed twice may be another's). */
  private final java.util.concurrent.atomic.AtomicBoolean released = new java.util.concurrent.atomic.AtomicBoolean();
  /** Where the socket was bound: a temporary path until {@link #publishAt} moves it. */
  private final Path boundAt;
  /** The socket file at {@link #path} once published (device and inode): removed at close only if still there. */
  private Object fileKey;

  /**
   * Binds the take-over socket at {@code bindAt} (a successor binds a temporary path and
   * renames it over the running daemon's, {@link #publishAt}), and starts listening.
   */
  public HandOver(Path path, Path bindAt, HandOverGate gate, Daemon daemon, String version) throws IOException {
    this.path = path.toAbsolutePath();
    this.gate = gate;
    this.daemon = daemon;
    this.version = version;
    this.uid = (int) new com.sun.security.auth.module.UnixSystem().getUid();
    Files.createDirectories(this.path.getParent());
    Path at = bindAt.toAbsolutePath();
    this.boundAt = at;
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

  /** Moves the socket bound at a temporary path to {@code path} (atomically replacing the running daemon's). */
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
        new HandOverAttempt(channel, gate, daemon, version, uid, () -> closed, () -> done = true).run();
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

  /**
   * The successor serves and this daemon's listeners sent their connections away: the requests
   * that waited for the hand-over's end are told to go there ({@link HandOverGate#moved}).
   */
  public void moved() {
    gate.moved();
  }

  /**
   * Stops listening, and waits for a hand-over in progress to end (a shutdown must not drain
   * sessions a successor is taking); removes the socket file if it is still this daemon's.
   * Idempotent, from any thread (the hand-over's own included: then it does not wait).
   */
  @Override
  public void close() {
    boolean first = released.compareAndSet(false, true);
    closed = true;
    if (first) {
      UnixSockets.shutdownQuietly(listening);
    }
    if (Thread.currentThread() != thread && thread.isAlive()) {
      try {
        thread.join(QUIESCE_MILLIS + 2 * ANSWER_MILLIS + 2 * LIVE_MILLIS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    if (!first) {
      return;
    }
    UnixSockets.closeQuietly(listening);
    try {
      if (fileKey == null) {
        // Never served: a temporary path not published yet is this daemon's alone.
        if (!boundAt.equals(path)) {
          Files.deleteIfExists(boundAt);
        }
      } else if (fileKey.equals(Files.readAttributes(path,
          java.nio.file.attribute.BasicFileAttributes.class, java.nio.file.LinkOption.NOFOLLOW_LINKS).fileKey())) {
        // A successor replaced the file with its own: leave that one alone.
        Files.deleteIfExists(path);
      }
    } catch (IOException e) {
      // gone already
    }
  }
}
