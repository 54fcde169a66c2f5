package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.Taken;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.SessionRegistry;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What a successor runs before it asks the running daemon for its state, so that the code of the
 * pause has been loaded, run and compiled in this JVM: a JVM that meets the take-over's codec, its
 * channel and its clients' first calls cold spends most of the pause in the interpreter and the
 * class loader (measured with {@code TakeOverPauseMain}: with an empty rehearsal state the restore
 * of 64 leases still took 55 ms, and the first lease answered came 68 ms after the successor
 * served). Nothing of it serves a client or changes this daemon's books:
 *
 * <ol>
 *   <li>{@link #served}, where a scratch daemon can be served ({@link Stage}: the host backend's
 *       descriptor segments): a scratch set of pools and sessions is served by the daemon's own
 *       services on a scratch socket, and a {@link RehearsalClient} makes a worker's calls on it
 *       (a session, its KeepAlive stream, leases and releases on it and unary ones, a share
 *       token; nothing that logs, as publishing or closing a session would) and keeps {@value
 *       #HELD} leases; that state is exported with its segments' descriptors, sent over a
 *       take-over channel to this process and restored into
 *       another scratch set, {@value #CODEC_ROUNDS} times (the JIT compiles what runs per lease);
 *       the last restored set is served in turn, the restored session reattached and leased on,
 *       then told it moved and its connection sent away: the running daemon's hand-over, a
 *       client's reattach and a handed-over daemon's last words, done here to oneself on data
 *       shaped like a real node's. Elsewhere {@link #codec} sends an empty state that way.
 *   <li>{@link #calls}: a health check, a unary Lease and a KeepAlive stream on this daemon's own
 *       Unix socket, still at its temporary path where no client finds it. The gate is closed, so
 *       the gpumemd calls are answered "moving" unapplied: what runs is the real listener's
 *       transport and interceptors, which the clients' reattach meets first.
 * </ol>
 *
 * <p>A rehearsal that fails is logged at DEBUG and ignored: it only makes the pause shorter.
 * Stateless; run by the starting thread.
 */
public final class Rehearsal {
  private static final Logger log = LoggerFactory.getLogger(Rehearsal.class);
  /** How long the rehearsal's calls may take in all; past it the successor asks for the state anyway. */
  private static final long CALLS_MILLIS = 5_000;
  /**
   * Leases the scratch session keeps, and so exports and restores: enough for the JIT to compile
   * the per-lease loops a node's thousands of leases run through. Measured with {@code
   * TakeOverPauseMain} and 10,000 live leases, 1,024 instead of 64 took the pause's p50 from
   * 243 to 211 ms and its max from 375 to 260 ms (the export alone from 96 to 67 ms).
   */
  static final int HELD = 1024;
  /** Leases leased and released on the stream per rehearsed client. */
  private static final int ROUNDS = 200;
  /** How often the scratch state makes its way: enough for the per-lease code to be compiled. */
  static final int CODEC_ROUNDS = 8;

  /** A scratch set of pools and sessions, new and never served. */
  public record Books(DevicePools pools, SessionRegistry registry) {}

  /** Serves a scratch set of books as this daemon serves its own (the same services and transport). */
  public interface Stage {
    /** A server of {@code books} on a Unix socket bound at {@code at}; closing it stops it and removes the file. */
    AutoCloseable serve(Books books, Path at) throws IOException;
  }

  /** A state read off a channel, with the descriptors that came with it (the caller's). */
  private record Received(State state, int[] fds) {}

  private Rehearsal() {}

  /** Where a rehearsal beside the take-over socket {@code socket} binds its channel for a moment. */
  public static Path channelPath(Path socket) {
    Path at = socket.toAbsolutePath();
    return at.resolveSibling(at.getFileName() + ".rehearsal-" + ProcessHandle.current().pid());
  }

  /**
   * What a daemon that started fresh runs once, when its first successor's Hello is accepted and
   * before its gate closes: the state's way out ({@link #codec}), which a successor's rehearsal
   * ran before it asked. Measured with {@code TakeOverPauseMain}, a fresh daemon's first export
   * and send took over 100 ms cold against under 10 ms warm, inside the pause. It is an empty
   * state's way, not the {@link #served} rehearsal with leases a successor runs: scratch segments
   * would take room on the backend from this daemon's own pools, which serve clients meanwhile.
   * Later calls do nothing; a failure is logged at DEBUG and ignored.
   */
  public static Runnable beforeFirstHandOver(Supplier<Books> scratch, Path channelAt) {
    AtomicBoolean ran = new AtomicBoolean();
    return () -> {
      if (ran.getAndSet(true)) {
        return;
      }
      long started = System.nanoTime();
      try {
        codec(scratch, channelAt);
      } catch (IOException | RuntimeException e) {
        log.debug("Take-over rehearsal of the state's way out failed (the pause may be longer): {}", e.toString());
      }
      log.debug("Take-over rehearsal before the first hand-over: {} ms", (System.nanoTime() - started) / 1_000_000);
    };
  }

  /**
   * Runs both parts.
   *
   * @param scratch makes a new, empty set of pools and sessions like this daemon's
   * @param stage serves scratch books, or null where this daemon's segments cannot be rehearsed
   *     with (memory of its own, or segments on paths its predecessor's files are on)
   * @param channelAt where the channel pair and the scratch sockets may bind for a moment (beside
   *     the take-over socket)
   * @param socket this daemon's Unix socket as bound (its temporary path), or null without one
   */
  public static void run(Supplier<Books> scratch, Stage stage, Path channelAt, Path socket) {
    long started = System.nanoTime();
    try {
      if (stage != null) {
        if (served(scratch, stage, channelAt, started + TimeUnit.MILLISECONDS.toNanos(CALLS_MILLIS)) == 0) {
          log.debug("Take-over rehearsal: the restored scratch session was not served after its reattach");
        }
      } else {
        codec(scratch, channelAt);
      }
    } catch (IOException | RuntimeException | InterruptedException e) {
      if (e instanceof InterruptedException) {
        Thread.currentThread().interrupt();
      }
      log.debug("Take-over rehearsal of the state's way failed (the pause may be longer): {}", e.toString());
    }
    long codec = System.nanoTime();
    if (socket != null) {
      try {
        calls(socket);
      } catch (RuntimeException | InterruptedException e) {
        if (e instanceof InterruptedException) {
          Thread.currentThread().interrupt();
        }
        log.debug("Take-over rehearsal of the first calls failed (the pause may be longer): {}", e.toString());
      }
    }
    long calls = System.nanoTime();
    // The rehearsal's garbage is collected now, while this daemon serves nobody, rather than by a
    // collection that the state's parse and restore would set off inside the pause.
    System.gc();
    log.debug("Take-over rehearsal: state's way {} ms, first calls {} ms, collection {} ms",
        (codec - started) / 1_000_000, (calls - codec) / 1_000_000, (System.nanoTime() - calls) / 1_000_000);
  }

  /**
   * A scratch daemon served and leased on, its state handed over to this process {@value
   * #CODEC_ROUNDS} times, and the restored state served and reattached to. Every scratch set is
   * closed at the end, its memory freed.
   *
   * @return how many leases the restored session was answered after its reattach ({@value #ROUNDS}, or 0)
   */
  static int served(Supplier<Books> scratch, Stage stage, Path channelAt, long deadlineNanos)
      throws IOException, InterruptedException {
    Path at = channelAt.toAbsolutePath();
    Path socket = at.resolveSibling(at.getFileName() + ".sock");
    List<Books> made = new ArrayList<>();
    try {
      Books from = scratch.get();
      made.add(from);
      String session;
      try (AutoCloseable server = stage.serve(from, socket);
          RehearsalClient client = new RehearsalClient(socket, deadlineNanos)) {
        session = exercise(client, from.pools().size());
      }
      Books to = from;
      for (int i = 0; i < CODEC_ROUNDS; i++) {
        to = scratch.get();
        made.add(to);
        handOver(from, to, at);
      }
      // The client is closed last: the server goes away with it connected, as a daemon that handed over does.
      try (RehearsalClient client = new RehearsalClient(socket, deadlineNanos);
          AutoCloseable server = stage.serve(to, socket)) {
        // A worker's client after a take-over: its restored session's stream, then its leases.
        // The sessions are not closed: that would log as a client's do; closing the pools is silent.
        List<String> leased = client.attach(session) ? client.leaseOnStream(0, ROUNDS, 0) : null;
        // What a daemon that handed over does: its clients are told that they moved, then its
        // listener sends them away (GOAWAY). Done here, it runs compiled when this one hands over.
        to.registry().moved();
        client.detach();
        return leased == null ? 0 : ROUNDS;
      }
    } catch (IOException | RuntimeException | InterruptedException e) {
      throw e;
    } catch (Exception e) {
      throw new IOException(e.toString(), e); // closing a scratch server or client
    } finally {
      made.forEach(b -> b.pools().close());
    }
  }

  /**
   * A worker's calls on a scratch daemon: a session leasing and releasing on its stream and with
   * unary calls on every device, {@value #HELD} leases kept, one of them shared, a second
   * session leasing; the stream ends, the sessions stay (as a client's that went away).
   *
   * @return the first session's id
   */
  private static String exercise(RehearsalClient client, int devices) throws InterruptedException, IOException {
    client.health();
    String session = client.openSession();
    if (!client.attach(session)) {
      throw new IOException("the scratch daemon did not attach the rehearsal's stream");
    }
    List<String> held = new ArrayList<>();
    for (int d = 0; d < devices; d++) {
      List<String> kept = client.leaseOnStream(d, ROUNDS / devices, HELD / devices);
      if (kept == null) {
        throw new IOException("the scratch daemon did not answer the rehearsal's leases");
      }
      held.addAll(kept);
      client.leaseUnary(session, d);
    }
    if (!held.isEmpty()) {
      client.share(session, held.get(0));
    }
    client.detach();
    String other = client.openSession();
    if (client.attach(other)) {
      client.leaseOnStream(devices - 1, 0, 1);
      client.detach();
    }
    return session;
  }

  /** The hand-over of an empty state from one scratch set of books to another, over a real channel. */
  static void codec(Supplier<Books> scratch, Path channelAt) throws IOException {
    Books from = scratch.get();
    Books to = scratch.get();
    try {
      handOver(from, to, channelAt);
    } finally {
      from.pools().close();
      to.pools().close();
    }
  }

  /**
   * The state of {@code from}, with its segments' descriptors, exported, sent to this process and
   * restored into {@code to}, as {@link HandOverAttempt} and a successor do.
   */
  private static void handOver(Books from, Books to, Path channelAt) throws IOException {
    List<SegmentFd> descriptors = new ArrayList<>();
    try {
      State state;
      try {
        state = TakeOverState.export(from.pools(), from.registry(), descriptors);
      } catch (TakeOverRefusedException e) {
        throw new IOException(e.getMessage(), e);
      }
      Received received = sendToSelf(state, descriptors.stream().map(SegmentFd::number).toList(), channelAt);
      TakeOverState.restore(received.state(), received.fds(), to.pools(), to.registry());
    } finally {
      for (SegmentFd d : descriptors) {
        try {
          d.close();
        } catch (IOException e) {
          // a copy: the segment stays the scratch pool's
        }
      }
    }
  }

  /**
   * Sends {@code state} with {@code fds} (or, without any, one stand-in descriptor that is closed
   * on arrival) from one end of a fresh take-over channel to the other, and a Taken back, as
   * {@link HandOverAttempt} and {@link TakeOver} do; the state read, with the descriptors received.
   */
  private static Received sendToSelf(State state, List<Integer> fds, Path channelAt) throws IOException {
    Path at = channelAt.toAbsolutePath();
    Files.deleteIfExists(at);
    int listening = UnixSockets.listen(at.toString());
    int client;
    int server;
    try {
      client = UnixSockets.connect(at.toString(), HandOver.ANSWER_MILLIS);
      server = UnixSockets.accept(listening);
    } finally {
      UnixSockets.closeQuietly(listening);
      Files.deleteIfExists(at);
    }
    try (TakeOverChannel holder = new TakeOverChannel(server); TakeOverChannel taker = new TakeOverChannel(client)) {
      holder.timeout(HandOver.ANSWER_MILLIS);
      List<Integer> sent = fds.isEmpty() ? List.of(server) : fds; // a descriptor rides along, as each segment's does
      holder.sendFds(sent);
      holder.send(TakeOverFrame.newBuilder().setState(state.toBuilder().setDescriptorCount(sent.size())
          .setPid((int) ProcessHandle.current().pid())).build());
      TakeOverFrame frame = taker.receiveFromHolder();
      List<Integer> came = taker.takeFds();
      if (fds.isEmpty()) {
        came.forEach(UnixSockets::closeQuietly);
        came = List.of();
      }
      taker.send(TakeOverFrame.newBuilder().setTaken(Taken.getDefaultInstance()).build());
      holder.receiveFromTaker();
      return new Received(frame.getState(), came.stream().mapToInt(Integer::intValue).toArray());
    }
  }

  /** A health check, a Lease and a KeepAlive message on this daemon's own socket (answered "moving"). */
  static void calls(Path socket) throws InterruptedException {
    try (RehearsalClient client = new RehearsalClient(socket,
        System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CALLS_MILLIS))) {
      client.health();
      try {
        client.leaseUnary("rehearsal", 0);
      } catch (StatusRuntimeException e) {
        // "moving": the gate is closed until the state is here
      }
      client.attach("rehearsal");
      client.detach();
    }
  }
}
