package io.gpumemd.server.takeover;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;
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
 *       #KEPT_ON_STREAM} leases, and the session {@value #HELD} in all with those leased in this
 *       process; that state is exported with its segments' descriptors, sent over a
 *       take-over channel to this process and restored into
 *       another scratch set, {@value #CODEC_ROUNDS} times (the JIT compiles what runs per lease);
 *       the last restored set is served in turn, the restored session reattached and leased on,
 *       then told it moved and its connection sent away: the running daemon's hand-over, a
 *       client's reattach and a handed-over daemon's last words, done here to oneself on data
 *       shaped like a real node's. Elsewhere the state's way is rehearsed, with as many
 *       leases, on a scratch backend ({@link #apart}), and then the last words alone ({@link
 *       #lastWords}).
 *   <li>{@link #calls}: a health check, a unary Lease and a KeepAlive stream on this daemon's own
 *       Unix socket, still at its temporary path where no client finds it. The gate is closed, so
 *       the gpumemd calls are answered "moving" unapplied: what runs is the real listener's
 *       transport and interceptors, which the clients' reattach meets first; then {@value
 *       #RECONNECTS} new connections, each for one KeepAlive stream, as the clients' reattach
 *       opens them.
 * </ol>
 *
 * <p>A rehearsal that fails is logged at DEBUG and ignored: it only makes the pause shorter.
 * Stateless; run by the starting thread, which reads each rehearsed state on a thread of its own.
 */
public final class Rehearsal {
  private static final Logger log = LoggerFactory.getLogger(Rehearsal.class);
  /** How long the rehearsal's calls may take in all; past it the successor asks for the state anyway. */
  private static final long CALLS_MILLIS = 5_000;
  /**
   * Leases the scratch session keeps, and so exports and restores: with {@link #CODEC_ROUNDS},
   * enough for the optimising compiler to take the per-lease code a node's thousands of leases
   * run through. {@code TakeOverPauseMain} with 10,000 live leases and the JIT's log: with 1,024
   * (each such method run about 8,000 times) both daemons compiled it inside the pause, the
   * hand-over (gate closed to Taken) 141 to 192 ms at p50; with 4,096, 100 to 110 ms, but the
   * loops over a state's leases and blocks (run once per state) were still interpreted, short of
   * the back-edge count (60,000) that compiles a loop where it runs; 8,192 pass that count.
   */
  static final int HELD = 8192;
  /**
   * Of the {@link #HELD} leases, those the rehearsal's client keeps on its stream; the rest are
   * leased in this process, straight from the scratch registry: the per-lease code of the
   * state's way is what needs them, and leasing them through the client took seconds.
   */
  static final int KEPT_ON_STREAM = 64;
  /** Leases leased and released on the stream per rehearsed client. */
  private static final int ROUNDS = 200;
  /** The one device of a scratch backend ({@link #apart}): room for the rehearsal's segments twice over, and more. */
  private static final long SCRATCH_BYTES = 128L << 20;
  /** How often the scratch state makes its way: enough for the per-lease code to be compiled. */
  static final int CODEC_ROUNDS = 8;
  /**
   * Rounds more, at most, after {@link #CODEC_ROUNDS}, each once the JIT's queue has drained, until
   * one sets off at most {@link #SETTLED_TICKS} of compilation or {@link #SETTLE_MILLIS} have
   * passed. The JIT raises its thresholds with its queue's length, which the rounds before keep
   * long: with 10,000 live leases, {@code TakeOverPauseMain} and the JIT's log showed the
   * successor compiling the per-block restore and the protobuf codec with the optimising compiler
   * inside the pause (50–85 ms of compiler time there, on two cores). The first rounds after the
   * queue drained set off 120–330 ms of compilation each, later ones 20–100.
   */
  static final int SETTLE_ROUNDS = 4;
  /** A round that cost the compiler threads this many clock ticks or fewer left the JIT settled. */
  private static final long SETTLED_TICKS = 3;
  /** How long the settling rounds may go on in all (while the running daemon serves, or waits for its successor). */
  private static final long SETTLE_MILLIS = 2_000;
  /** How long the compiler threads may take to go idle before a settling round. */
  private static final long SETTLE_WAIT_MILLIS = 1_000;
  /**
   * The least time the calls after the rounds are given, counted from the rounds' end ({@link
   * #afterRounds}): the rounds took 5–6 s on two loaded cores, past the bound on all the calls,
   * and the restored session's reattach then failed at once, unrehearsed.
   */
  private static final long AFTER_ROUNDS_MILLIS = 2_000;

  /**
   * New connections the rehearsal opens on this daemon's own socket, each for one KeepAlive stream:
   * every client of the running daemon opens one here as soon as it is told the session moved,
   * inside the pause. Run once, a new connection's way through the listener's transport (its
   * HTTP/2 negotiation, the connection cap, the call's interceptors) ran in the interpreter:
   * {@code TakeOverPauseMain} with 64 live leases, timestamped, showed 8–17 ms from the
   * reattaching client's connection reaching the successor to its KeepAlive call starting there,
   * and after 250–300 such connections 3–8 ms (the longest lease wait over 20 take-overs, p50 /
   * max: 61 / 119 ms before, 53 / 93 ms after).
   */
  static final int RECONNECTS = 250;
  /** How long those connections may take in all (13–17 ms each on two loaded cores, faster once compiled). */
  private static final long RECONNECT_MILLIS = 3_000;

  /** A scratch set of pools and sessions on {@code backend}, new and never served. */
  public record Books(DevicePools pools, SessionRegistry registry, MemoryBackend backend) {}

  /** Serves a scratch set of books as this daemon serves its own (the same services and transport). */
  public interface Stage {
    /** A server of {@code books} on a Unix socket bound at {@code at}; closing it stops it and removes the file. */
    AutoCloseable serve(Books books, Path at) throws IOException;
  }

  private Rehearsal() {}

  /** Where a rehearsal beside the take-over socket {@code socket} binds its channel for a moment. */
  public static Path channelPath(Path socket) {
    Path at = socket.toAbsolutePath();
    return at.resolveSibling(at.getFileName() + ".rehearsal-" + ProcessHandle.current().pid());
  }

  /**
   * What a daemon that started fresh runs once, when its first successor's Hello is accepted and
   * before its gate closes: the state's way out and in with {@value #HELD} leases ({@link
   * #codec}), which a successor's rehearsal ran before it asked, on scratch books of a scratch
   * backend ({@link #apart}): segments of this daemon's own backend would take room from its
   * pools, which serve clients meanwhile. Measured with {@code TakeOverPauseMain} and 10,000 live
   * leases, a fresh daemon's first export and send took 169 ms cold, inside the pause, and 42–55
   * ms after this (two runs). Then, with a Unix listener, a handed-over daemon's last words
   * ({@link #lastWords}): without them a fresh daemon's first take-over under a worker holding 64
   * leases had the longest lease wait of its run, 111–134 ms (five runs), where later take-overs
   * waited about 50; with them 78–97 ms (six runs), for about 0.4 s more before the gate closes.
   * Later calls do nothing; a failure is logged at DEBUG and ignored.
   *
   * @param books makes a new, empty set of pools and sessions like this daemon's on a backend
   * @param stage serves scratch books, or null without a Unix listener
   */
  public static Runnable beforeFirstHandOver(Function<MemoryBackend, Books> books, Stage stage, Path channelAt) {
    AtomicBoolean ran = new AtomicBoolean();
    return () -> {
      if (ran.getAndSet(true)) {
        return;
      }
      long started = System.nanoTime();
      try {
        apart(books, channelAt, scratch -> {
          codec(scratch, channelAt);
          if (stage != null) {
            lastWords(scratch, stage, channelAt, afterRounds(started + TimeUnit.MILLISECONDS.toNanos(CALLS_MILLIS)));
          }
        });
      } catch (IOException | RuntimeException | InterruptedException e) {
        failed("before the first hand-over", e);
      }
      log.debug("Take-over rehearsal before the first hand-over: {} ms", (System.nanoTime() - started) / 1_000_000);
    };
  }

  /**
   * Runs both parts.
   *
   * @param books makes a new, empty set of pools and sessions like this daemon's on a backend
   * @param backend this daemon's backend where scratch books on it can be served; null where this
   *     daemon's segments cannot be rehearsed with (memory of its own, or segments on paths its
   *     predecessor's files are on): then the state's way and the last words are rehearsed on a
   *     scratch backend ({@link #apart})
   * @param stage serves scratch books, or null without a Unix listener (then only the state's way
   *     is rehearsed, on a scratch backend)
   * @param channelAt where the channel pair and the scratch sockets may bind for a moment (beside
   *     the take-over socket)
   * @param socket this daemon's Unix socket as bound (its temporary path), or null without one
   */
  public static void run(Function<MemoryBackend, Books> books, MemoryBackend backend, Stage stage, Path channelAt,
      Path socket) {
    long started = System.nanoTime();
    try {
      long deadline = started + TimeUnit.MILLISECONDS.toNanos(CALLS_MILLIS);
      if (backend != null && stage != null) {
        if (served(() -> books.apply(backend), stage, channelAt, deadline) == 0) {
          log.debug("Take-over rehearsal: the restored scratch session was not served after its reattach");
        }
      } else {
        apart(books, channelAt, scratch -> {
          codec(scratch, channelAt);
          if (stage != null) {
            lastWords(scratch, stage, channelAt, afterRounds(deadline));
          }
        });
      }
    } catch (IOException | RuntimeException | InterruptedException e) {
      failed("of the state's way", e);
    }
    long codec = System.nanoTime();
    if (socket != null) {
      try {
        calls(socket);
      } catch (RuntimeException | InterruptedException e) {
        failed("of the first calls", e);
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
    Path socket = scratchSocket(channelAt);
    List<Books> made = new ArrayList<>();
    try {
      Books from = scratch.get();
      made.add(from);
      String session;
      try (AutoCloseable server = stage.serve(from, socket);
          RehearsalClient client = new RehearsalClient(socket, deadlineNanos)) {
        session = exercise(client, from.pools().size());
      }
      holdMore(from, session, HELD - KEPT_ON_STREAM);
      Books to = handOverRounds(from, scratch, at, made);
      // The client is closed last: the server goes away with it connected, as a daemon that handed over does.
      try (RehearsalClient client = new RehearsalClient(socket, afterRounds(deadlineNanos));
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
   * A handed-over daemon's last words, on scratch books: a client's session leases once on its
   * KeepAlive stream, is told that it moved, and its connection is sent away (GOAWAY) as the
   * scratch server stops, as {@link #served} ends. For a daemon that started fresh, whose first
   * hand-over would otherwise load and run that code for the first time inside the pause.
   *
   * @return whether the client was told that its session moved
   */
  static boolean lastWords(Supplier<Books> scratch, Stage stage, Path channelAt, long deadlineNanos)
      throws IOException, InterruptedException {
    Books books = scratch.get();
    // The client is closed last: the server goes away with it connected.
    try (RehearsalClient client = new RehearsalClient(scratchSocket(channelAt), deadlineNanos);
        AutoCloseable server = stage.serve(books, scratchSocket(channelAt))) {
      if (!client.attach(client.openSession()) || client.leaseOnStream(0, 1, 0) == null) {
        return false;
      }
      books.registry().moved();
      boolean told = client.awaitMoving();
      client.detach();
      return told;
    } catch (IOException | RuntimeException | InterruptedException e) {
      throw e;
    } catch (Exception e) {
      throw new IOException(e.toString(), e); // closing the scratch server or client
    } finally {
      books.pools().close();
    }
  }

  /** A rehearsal step that failed: it only makes the pause shorter, so it says so at DEBUG. */
  private static void failed(String what, Exception e) {
    if (e instanceof InterruptedException) {
      Thread.currentThread().interrupt();
    }
    log.debug("Take-over rehearsal {} failed (the pause may be longer): {}", what, e.toString());
  }

  /** Where a rehearsal beside {@code channelAt} serves scratch books. */
  private static Path scratchSocket(Path channelAt) {
    Path at = channelAt.toAbsolutePath();
    return at.resolveSibling(at.getFileName() + ".sock");
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
      List<String> kept = client.leaseOnStream(d, ROUNDS / devices, KEPT_ON_STREAM / devices);
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

  /**
   * Leases {@code count} more blocks of the smallest size for the session, across the devices
   * (4,096 of them fill one small segment: the per-lease code needs their number, not their bytes).
   */
  private static void holdMore(Books books, String sessionId, int count) {
    Session session = null;
    for (Session s : books.registry().sessions(Caller.DAEMON)) {
      if (s.id().equals(sessionId)) {
        session = s;
      }
    }
    if (session == null) {
      throw new IllegalStateException("the rehearsal's session " + sessionId + " is gone from its scratch books");
    }
    int devices = books.pools().size();
    for (int d = 0; d < devices; d++) {
      // Scratch books may be on this daemon's own backend (a successor's, before it serves), and
      // each restore adopts their segments again: a small device keeps most of its room.
      long fit = books.pools().get(d).limitBytes() / 8 / SizeClasses.ALIGNMENT;
      for (long i = Math.min(count / devices, fit); i > 0; i--) {
        books.registry().lease(session.owner(), sessionId, d, SizeClasses.ALIGNMENT, false, "", false);
      }
    }
  }

  /** A rehearsal on scratch books that {@link #apart} makes. */
  @FunctionalInterface
  interface OnScratch {
    void run(Supplier<Books> scratch) throws IOException, InterruptedException;
  }

  /**
   * Runs {@code rehearsal} on scratch books of a scratch backend ({@link HostShmBackend#scratch}):
   * memfds of this process, in a directory beside {@code channelAt}, apart from every device this
   * daemon serves; the backend is closed after. The per-lease code rehearsed is the same whatever
   * backend the daemon's own segments are on.
   */
  static void apart(Function<MemoryBackend, Books> books, Path channelAt, OnScratch rehearsal)
      throws IOException, InterruptedException {
    Path at = channelAt.toAbsolutePath();
    HostShmBackend scratch = HostShmBackend.scratch(at.resolveSibling(at.getFileName() + ".shm"), SCRATCH_BYTES);
    try {
      rehearsal.run(() -> books.apply(scratch));
    } finally {
      scratch.close();
    }
  }

  /**
   * A scratch session holding {@value #HELD} leases, its state handed over from one scratch set of
   * books to another {@value #CODEC_ROUNDS} times over a real channel (the JIT compiles what runs
   * per lease); every set is closed at the end, its memory freed.
   */
  static void codec(Supplier<Books> scratch, Path channelAt) throws IOException {
    List<Books> made = new ArrayList<>();
    try {
      Books from = scratch.get();
      made.add(from);
      holdMore(from, from.registry().open(Caller.DAEMON, "rehearsal", 0, 0).id(), HELD);
      handOverRounds(from, scratch, channelAt, made);
    } finally {
      made.forEach(b -> b.pools().close());
    }
  }

  /**
   * {@code from}'s state handed over to a new scratch set {@value #CODEC_ROUNDS} times, then up to
   * {@value #SETTLE_ROUNDS} more until the JIT settles, each set added to {@code made}; every set
   * but the last is closed once its round is done (it holds copies of the scratch segments).
   *
   * @return the last set
   */
  private static Books handOverRounds(Books from, Supplier<Books> scratch, Path channelAt, List<Books> made)
      throws IOException {
    Books to = from;
    for (int i = 0; i < CODEC_ROUNDS; i++) {
      to = round(from, to, scratch, channelAt, made);
    }
    // The JIT raises its thresholds while its queue is long, as the rounds above kept it: the
    // per-lease code is left half compiled, and would be compiled for good inside the pause. Let
    // the queue drain, then go on until a round sets off hardly any compilation of its own.
    long settleUntil = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(SETTLE_MILLIS);
    boolean idle = awaitCompilers();
    int settling = 0;
    while (settling < SETTLE_ROUNDS && idle && System.nanoTime() < settleUntil) {
      settling++;
      long ticks = CompilerQuiet.compilerTicks();
      to = round(from, to, scratch, channelAt, made);
      idle = awaitCompilers();
      if (idle && CompilerQuiet.compilerTicks() - ticks <= SETTLED_TICKS) {
        break;
      }
    }
    // A daemon that serves while it rehearses (one that started fresh) may find its compiler
    // threads never idle, and so settle nothing: this line says so.
    log.debug("Take-over rehearsal: {} rounds and {} settling, of a state with {} leases (compiler threads {})",
        CODEC_ROUNDS, settling, from.registry().liveLeases(), idle ? "idle" : "still busy");
    return to;
  }

  /**
   * One round: {@code from}'s state handed over to a new scratch set, added to {@code made}; the
   * previous round's set ({@code to}, unless it is {@code from}) is closed first.
   */
  private static Books round(Books from, Books to, Supplier<Books> scratch, Path channelAt, List<Books> made)
      throws IOException {
    if (to != from) {
      to.pools().close();
    }
    Books next = scratch.get();
    made.add(next);
    SelfHandOver.handOver(from, next, channelAt);
    return next;
  }

  /** The deadline of calls made after the rounds: {@code deadlineNanos}, or {@link #AFTER_ROUNDS_MILLIS} from now if later. */
  private static long afterRounds(long deadlineNanos) {
    return Math.max(deadlineNanos, System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(AFTER_ROUNDS_MILLIS));
  }

  /** Waits for the JIT's compiler threads to go idle; false when they do not within the bound (or on interrupt). */
  private static boolean awaitCompilers() {
    try {
      return CompilerQuiet.await(SETTLE_WAIT_MILLIS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /**
   * A health check, a Lease and a KeepAlive message on this daemon's own socket (answered
   * "moving"), then up to {@value #RECONNECTS} connections more, each opened for one KeepAlive
   * stream as a reattaching client's is, for at most {@value #RECONNECT_MILLIS} ms.
   */
  static void calls(Path socket) throws InterruptedException {
    try (RehearsalClient client = new RehearsalClient(socket,
        System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CALLS_MILLIS + RECONNECT_MILLIS))) {
      client.health();
      try {
        client.leaseUnary("rehearsal", 0);
      } catch (StatusRuntimeException e) {
        // "moving": the gate is closed until the state is here
      }
      client.attach("rehearsal");
      client.detach();
      long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RECONNECT_MILLIS);
      for (int i = 0; i < RECONNECTS && System.nanoTime() - until < 0; i++) {
        client.reconnect();
        client.attach("rehearsal");
        client.detach();
      }
    }
  }
}
