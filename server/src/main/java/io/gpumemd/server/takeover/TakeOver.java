package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.ErrnoCalls;
import io.gpumemd.common.unix.ProcessStat;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.Abort;
import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.Live;
import io.gpumemd.proto.takeover.v1.Ready;
import io.gpumemd.proto.takeover.v1.SegmentsAhead;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.Taken;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.IncomingSegments;
import java.io.EOFException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The successor's side of a take-over ({@code gpumemd --take-over}; taking over, where {@link
 * HandOver} is the running daemon's, handing over): asks the running daemon behind the
 * take-over socket for its state, and tells it when the state is taken and when this daemon
 * serves. What {@link HandOver} describes, from the other end.
 *
 * <p>Outcomes of {@link #request}: the state (with the segments' descriptors, owned by the
 * returned object until restored); null when there is nobody to take over, or the running daemon
 * died before its state was complete (then this daemon starts fresh and says so); or an
 * IOException for a refusal, which leaves the running daemon serving and stops this one.
 *
 * <p>Whom it trusts: a state is memory this daemon will serve, so it is taken only from a running
 * daemon that runs as this daemon's uid (SO_PEERCRED of the connection), whose socket file this uid
 * owns, in a directory that no other user can write to or, if others may write there, with the
 * sticky bit (as /tmp: others cannot rename or remove this uid's file there). Anything else may
 * be another user squatting the take-over path, and is refused before a word is sent to it.
 *
 * <p>After the state came, the running daemon closes the connection before Taken only when it
 * dies: when it gives the hand-over up it says so first (a Refusal; {@link HandOverAttempt}). So a Taken that
 * cannot be sent is told apart by what is left to read ({@link #taken}), never by whether a pid
 * looks alive (a SIGKILLed process is a zombie, "alive", until its parent reaps it).
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
  private static final int S_IWGRP_IWOTH = 0022;
  private static final int S_ISVTX = 01000;
  /** How long a daemon that went away mid-hand-over is given to finish exiting (a JVM's takes well under 1 s). */
  static final long DYING_MILLIS = 5_000;

  private final TakeOverChannel channel;
  /** The books the state brought (with the books sent ahead, when it carried only changes). */
  private final TakeOverState.Books books;
  private final IncomingSegments segments;
  /** Pidfds of processes the running daemon followed by pidfd, by pidfs inode, until taken; guarded by the caller (one thread). */
  private final Map<Long, Integer> pidfds;
  private final int runningDaemonPid;

  private TakeOver(TakeOverChannel channel, int runningDaemonPid, TakeOverState.Books books, IncomingSegments segments,
      Map<Long, Integer> pidfds) {
    this.channel = channel;
    this.books = books;
    this.segments = segments;
    this.pidfds = pidfds;
    this.runningDaemonPid = runningDaemonPid;
  }

  /**
   * Asks the daemon behind {@code socket} for its state; segments it sends ahead of the state
   * (where {@code hello} takes them) are adopted by {@code backend} while it still serves.
   *
   * @return the state, or null to start fresh (nobody there, or the daemon died mid-way)
   * @throws IOException when the running daemon refused, or cannot be asked (the message says why)
   */
  public static TakeOver request(Path socket, Hello hello, MemoryBackend backend) throws IOException {
    String path = socket.toAbsolutePath().toString();
    TakeOverChannel channel = connect(path);
    if (channel == null) {
      return null;
    }
    // Adopted ahead of the state: given up on every way out but the TakeOver that owns them.
    List<SegmentMemory> ahead = new ArrayList<>();
    // Descriptors that came with the books sent ahead: closed on every way out but the TakeOver.
    List<Integer> aheadFds = new ArrayList<>();
    TakeOverState.Books booksAhead = null;
    try {
      String untrusted = untrustedRunningDaemon(socket.toAbsolutePath(), channel);
      if (untrusted != null) {
        throw new IOException("take-over: refusing the state offered on " + path + ": " + untrusted
            + "; nothing was taken, and this daemon does not start");
      }
      int runningPid = channel.peer()[0];
      channel.send(TakeOverFrame.newBuilder().setHello(hello).build());
      long started = System.nanoTime();
      TakeOverFrame frame;
      try {
        frame = channel.receiveFromHolder();
        if (frame.hasSegmentsAhead()) {
          adoptAhead(backend, frame.getSegmentsAhead(), channel.takeFds(), ahead, channel);
          log.info("--take-over: {} segment(s) sent ahead adopted after {} ms", ahead.size(),
              (System.nanoTime() - started) / 1_000_000);
          // Adopting them compiled code of its own: the pause, which the Ready starts, should not
          // share the cores with that compilation.
          CompilerQuiet.beforePause();
          channel.send(TakeOverFrame.newBuilder().setReady(Ready.getDefaultInstance()).build());
          frame = channel.receiveFromHolder();
        }
        if (frame.hasStateAhead()) {
          booksAhead = readAhead(frame.getStateAhead(), channel, aheadFds, started);
          channel.send(TakeOverFrame.newBuilder().setReady(Ready.getDefaultInstance()).build());
          frame = channel.receiveFromHolder();
        }
      } catch (IOException e) {
        if (e instanceof AheadRefused) {
          throw e;
        }
        if (!gone(e)) {
          throw new IOException("take-over: the running daemon did not answer: " + e.getMessage());
        }
        IncomingSegments.relinquishAll(backend, ahead);
        log.warn("--take-over: the running daemon went away before its state was complete: starting fresh (the "
            + "sessions it held are gone; their memory went with it)");
        awaitExit(runningPid, DYING_MILLIS);
        channel.close();
        return null;
      }
      if (frame.hasRefusal() || !frame.hasState()) {
        throw new IOException(frame.hasRefusal()
            ? "take-over refused by the running daemon (it serves on, untouched): " + frame.getRefusal().getReason()
            : "take-over: the running daemon answered " + frame.getFrameCase() + " instead of its state");
      }
      return received(channel, frame.getState(), booksAhead, aheadFds, ahead, backend, started);
    } catch (IOException | RuntimeException e) {
      IncomingSegments.relinquishAll(backend, ahead);
      aheadFds.forEach(UnixSockets::closeQuietly);
      channel.close();
      throw e;
    }
  }

  /**
   * The TakeOver of a state read off {@code channel}: its descriptors checked against it, and its
   * books (applied to those sent ahead, when it carries only changes; the running daemon is told
   * when they do not fit). On a failure the caller gives up what it holds ({@code ahead}, and
   * {@code aheadFds} unless they moved here: then the list is empty).
   */
  private static TakeOver received(TakeOverChannel channel, State state, TakeOverState.Books booksAhead,
      List<Integer> aheadFds, List<SegmentMemory> ahead, MemoryBackend backend, long started) throws IOException {
    List<Integer> fds = channel.takeFds();
    if (fds.size() != state.getDescriptorCount()) {
      fds.forEach(UnixSockets::closeQuietly);
      throw new IOException("take-over: " + fds.size() + " descriptor(s) came with a state that names "
          + state.getDescriptorCount());
    }
    Map<Long, Integer> pidfds = pidfds(state, fds);
    List<Integer> segmentFds = new ArrayList<>(aheadFds);
    segmentFds.addAll(fds.subList(0, fds.size() - state.getHiddenProcessInodesCount()));
    aheadFds.clear(); // in segmentFds now, which the IncomingSegments below owns
    TakeOverState.Books books;
    try {
      books = books(state, booksAhead);
    } catch (IllegalStateException e) {
      segmentFds.forEach(UnixSockets::closeQuietly);
      pidfds.values().forEach(UnixSockets::closeQuietly);
      String reason = "its state does not fit the books it sent ahead (" + e.getMessage() + ")";
      abort(channel, reason);
      throw new IOException("take-over: the running daemon's " + reason + "; it serves on, and this daemon does not "
          + "start");
    }
    log.info("--take-over: state of pid {} (gpumemd {}) received after {} ms: {} segment(s), {} of them sent ahead, "
        + "{} bytes of books", state.getPid(), state.getVersion(), (System.nanoTime() - started) / 1_000_000,
        ahead.size() + segmentFds.size(), ahead.size(), channel.lastFrameBytes());
    try {
      return new TakeOver(channel, state.getPid(), books,
          new IncomingSegments(backend, ahead, segmentFds.stream().mapToInt(Integer::intValue).toArray()), pidfds);
    } catch (RuntimeException e) {
      pidfds.values().forEach(UnixSockets::closeQuietly);
      throw e;
    }
  }

  /**
   * Reads the books the running daemon sent ahead of its pause, with the descriptors that came
   * with them (into {@code fds}); a state_ahead that does not read is answered Abort (the running
   * daemon serves on).
   */
  private static TakeOverState.Books readAhead(State ahead, TakeOverChannel channel, List<Integer> fds, long started)
      throws IOException {
    fds.addAll(channel.takeFds());
    String broken = null;
    TakeOverState.Books books = null;
    if (fds.size() != ahead.getDescriptorCount()) {
      broken = fds.size() + " descriptor(s) came with books that name " + ahead.getDescriptorCount();
    } else if (ahead.getChangesOnly() || ahead.getHiddenProcessInodesCount() > 0) {
      broken = "the books sent ahead carry changes or pidfds, which only the last state may";
    } else {
      try {
        books = TakeOverState.fromProto(ahead);
      } catch (RuntimeException e) {
        broken = "the books sent ahead do not read (" + e.getMessage() + ")";
      }
    }
    if (broken != null) {
      abort(channel, broken);
      throw new AheadRefused("take-over: " + broken + "; the running daemon serves on, and this daemon does not start",
          null);
    }
    log.info("--take-over: books of pid {} ({} leases, {} bytes) read ahead of the pause after {} ms", ahead.getPid(),
        books.sessions().leases().size(), channel.lastFrameBytes(), (System.nanoTime() - started) / 1_000_000);
    return books;
  }

  /** The books {@code state} brings: itself, or its changes applied to the books sent ahead. */
  private static TakeOverState.Books books(State state, TakeOverState.Books ahead) {
    if (!state.getChangesOnly()) {
      return TakeOverState.fromProto(state);
    }
    if (ahead == null) {
      throw new IllegalStateException("it sent changes only, but no books ahead");
    }
    return StateChanges.apply(ahead, StateChanges.fromProto(state));
  }

  private static void abort(TakeOverChannel channel, String reason) {
    try {
      channel.send(TakeOverFrame.newBuilder().setAbort(Abort.newBuilder().setReason(reason)).build());
    } catch (IOException e) {
      // it serves on either way once it reads no Ready, or no Taken
    }
  }

  /** A channel to the running daemon at {@code path}; null when nobody answers there (start fresh). */
  private static TakeOverChannel connect(String path) throws IOException {
    try {
      return TakeOverChannel.connect(path, HandOver.HELLO_MILLIS + HandOver.QUIESCE_MILLIS);
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
  }

  /**
   * The pidfds among the descriptors that came with {@code state} (the last ones: of processes the
   * running daemon followed by pidfd), by pidfs inode; every descriptor is closed when the count
   * does not add up.
   */
  private static Map<Long, Integer> pidfds(State state, List<Integer> fds) throws IOException {
    int hidden = state.getHiddenProcessInodesCount();
    if (hidden > fds.size()) {
      fds.forEach(UnixSockets::closeQuietly);
      throw new IOException("take-over: the state names " + hidden + " pidfd(s) and " + fds.size()
          + " descriptor(s) came in all");
    }
    int first = fds.size() - hidden;
    Map<Long, Integer> pidfds = new LinkedHashMap<>();
    for (int i = 0; i < hidden; i++) {
      Integer twice = pidfds.put(state.getHiddenProcessInodes(i), fds.get(first + i));
      if (twice != null) {
        UnixSockets.closeQuietly(twice);
      }
    }
    return pidfds;
  }

  /**
   * Why the running daemon on the other end of {@code channel}, connected at {@code socket}, may be
   * another user's, or null when it is this uid's own: its directory is writable by no other
   * user (or sticky, and owned by this uid or root), the socket file is this uid's, and the
   * process listening there runs as this uid.
   */
  static String untrustedRunningDaemon(Path socket, TakeOverChannel channel) throws IOException {
    int uid = (int) new com.sun.security.auth.module.UnixSystem().getUid();
    Path dir = socket.getParent().toRealPath();
    int dirMode = (Integer) Files.getAttribute(dir, "unix:mode");
    int dirOwner = (Integer) Files.getAttribute(dir, "unix:uid");
    if (dirOwner != uid && dirOwner != 0) {
      return "its directory " + dir + " is owned by uid " + dirOwner + ", who may replace the socket there (expected: "
          + "a directory of uid " + uid + " or root)";
    }
    if ((dirMode & S_IWGRP_IWOTH) != 0 && (dirMode & S_ISVTX) == 0) {
      return "its directory " + dir + " (mode " + String.format("%04o", dirMode & 07777) + ") is writable by others "
          + "without the sticky bit, so another user may have replaced the socket (expected: a directory only its "
          + "owner writes to, or a sticky one like /tmp)";
    }
    int[] peer = channel.peer();
    if (peer[1] != uid) {
      return "the process listening there (pid " + peer[0] + ") runs as uid " + peer[1] + ", not as this daemon's uid "
          + uid + " (a daemon to take over runs as the same uid; another user may have put it there)";
    }
    int fileOwner = (Integer) Files.getAttribute(socket, "unix:uid", LinkOption.NOFOLLOW_LINKS);
    if (fileOwner != uid) {
      return "the socket file is owned by uid " + fileOwner + ", not by this daemon's uid " + uid;
    }
    return null;
  }

  /** Segments sent ahead that cannot be adopted: the running daemon was told (Abort), and serves on. */
  static final class AheadRefused extends IOException {
    AheadRefused(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /**
   * Adopts the segments the running daemon sent ahead of its state, in the order sent, into
   * {@code adopted}; on a failure the running daemon is told (Abort). See {@link #adopt}.
   */
  private static void adoptAhead(MemoryBackend backend, SegmentsAhead ahead, List<Integer> fds,
      List<SegmentMemory> adopted, TakeOverChannel channel) throws IOException {
    try {
      adopt(backend, ahead, fds, adopted);
    } catch (AheadRefused e) {
      abort(channel, e.getMessage());
      throw new AheadRefused("take-over: " + e.getMessage() + "; the running daemon serves on, and this daemon "
          + "does not start", e.getCause());
    }
  }

  /**
   * Adopts segments sent ahead of a state, in the order sent, into {@code adopted} ({@link
   * MemoryBackend#adopt} checks each and owns its descriptor from then on). On a failure the
   * descriptors not reached are closed; the caller relinquishes what was adopted.
   *
   * @throws AheadRefused saying which segment, and why
   */
  static void adopt(MemoryBackend backend, SegmentsAhead ahead, List<Integer> fds, List<SegmentMemory> adopted)
      throws AheadRefused {
    if (fds.size() != ahead.getSegmentsCount()) {
      fds.forEach(UnixSockets::closeQuietly);
      throw new AheadRefused(fds.size() + " descriptor(s) came with " + ahead.getSegmentsCount()
          + " segment(s) sent ahead", null);
    }
    for (int i = 0; i < fds.size(); i++) {
      SegmentsAhead.Entry e = ahead.getSegments(i);
      try {
        adopted.add(backend.adopt(e.getDevice(), fds.get(i), e.getBytes()));
      } catch (RuntimeException failed) {
        for (int rest = i + 1; rest < fds.size(); rest++) {
          UnixSockets.closeQuietly(fds.get(rest));
        }
        throw new AheadRefused("segment " + e.getId() + " sent ahead cannot be adopted (" + failed.getMessage() + ")",
            failed);
      }
    }
  }

  /**
   * Waits, at most {@code millis}, until the process that went away mid-hand-over has exited. A
   * dying process closes its descriptors one by one: its take-over connection may be closed
   * while its listening sockets still accept, and a fresh start refuses a socket that accepts.
   */
  static void awaitExit(int pid, long millis) throws IOException {
    if (pid <= 0 || pid == ProcessHandle.current().pid()) {
      return; // in another PID namespace (SO_PEERCRED gave 0), or this process itself
    }
    long start = ProcessStat.read(pid).startTicks();
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    boolean runs = ProcessStat.anyThreadRuns(pid);
    while (runs && System.nanoTime() < deadline) {
      try {
        Thread.sleep(10);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException("interrupted waiting for pid " + pid + " to exit");
      }
      // Another process on the pid (start time changed) means that one exited long ago.
      runs = ProcessStat.anyThreadRuns(pid) && ProcessStat.read(pid).startTicks() == start;
    }
    if (runs) {
      log.warn("--take-over: pid {} closed the take-over connection but still runs after {} ms", pid, millis);
    }
  }

  /** The peer closed or reset the connection (it died), as opposed to a timeout or a bad frame. */
  private static boolean gone(IOException e) {
    return e instanceof EOFException
        || e instanceof ErrnoCalls.ErrnoException errno && (errno.errno() == ECONNRESET || errno.errno() == EPIPE);
  }

  /** The running daemon's books, to restore. */
  public TakeOverState.Books books() {
    return books;
  }

  /** The segments, by the state's descriptor indexes; the restored pools take those it names. */
  public IncomingSegments segments() {
    return segments;
  }

  /**
   * The pidfds of the processes the running daemon followed by pidfd (in PID namespaces it could
   * not see), by pidfs inode: the caller owns them from here (see {@code DescriptorPins#adopt});
   * those never taken are closed with this take-over.
   */
  public Map<Long, Integer> takeHiddenProcessPidfds() {
    Map<Long, Integer> taken = Map.copyOf(pidfds);
    pidfds.clear();
    return taken;
  }

  /** The sessions that had a stream attached when the running daemon wrote its state down. */
  public int attachedSessions() {
    return (int) books.sessions().sessions().stream().filter(s -> s.streamAttached()).count();
  }

  public int runningDaemonPid() {
    return runningDaemonPid;
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
   * The state is this daemon's now. A running daemon that gave the hand-over up (it waited too
   * long for this) said so before it closed: its Refusal is read here, and this daemon must not
   * serve. A connection closed with no Refusal is a running daemon that died after sending the
   * state (it never closes otherwise before Taken; {@link HandOverAttempt#giveUp}): the memory is
   * this daemon's, and it serves, whatever state that process is in (a zombie looks alive until
   * it is reaped).
   *
   * @throws IOException when the running daemon gave the hand-over up, or cannot be told apart
   *     from one
   */
  public void taken() throws IOException {
    try {
      channel.send(TakeOverFrame.newBuilder().setTaken(Taken.getDefaultInstance()).build());
      return;
    } catch (IOException e) {
      log.info("--take-over: Taken could not be sent to pid {} ({}); reading what it left", runningDaemonPid,
          e.getMessage());
    }
    TakeOverFrame left;
    try {
      // A running daemon giving up queues its Refusal before it closes (it may still be sending it).
      channel.timeout(HandOver.LIVE_MILLIS + HandOver.ANSWER_MILLIS);
      left = channel.receiveFromHolder();
    } catch (IOException e) {
      if (gone(e)) {
        log.warn("--take-over: the previous daemon (pid {}) went away after sending its state (the connection "
            + "closed with no word, as only a dead holder's does); carrying on with it", runningDaemonPid);
        return;
      }
      throw new IOException("take-over: cannot tell whether the previous daemon (pid " + runningDaemonPid + ") gave the "
          + "hand-over up (" + e.getMessage() + "); this daemon does not serve its memory");
    }
    throw new IOException("take-over: the previous daemon (pid " + runningDaemonPid + ") "
        + (left.hasRefusal() ? "gave the hand-over up and serves on: " + left.getRefusal().getReason()
            : "answered " + left.getFrameCase() + " after its state")
        + "; this daemon does not serve its memory");
  }

  /** This daemon serves on the socket path: the running daemon may stop. */
  public void live() {
    try {
      channel.send(TakeOverFrame.newBuilder().setLive(Live.getDefaultInstance()).build());
    } catch (IOException e) {
      // it stops anyway once it has seen Taken
    }
  }

  @Override
  public void close() {
    segments.close();
    pidfds.values().forEach(UnixSockets::closeQuietly);
    pidfds.clear();
    channel.close();
  }
}
