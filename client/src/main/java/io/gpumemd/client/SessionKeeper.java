package io.gpumemd.client;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps the client's session: opens it, holds its KeepAlive stream (reattaching within the
 * grace period when it breaks), sees it lost, and opens a new one when a call asks after a loss.
 *
 * <p>A session is lost when the daemon ends its stream (NOT_FOUND, or completed), when the
 * stream stays broken past the grace period, or, without a stream, when a call gets NOT_FOUND
 * for it. The next call then opens a new session, retrying with backoff ({@value
 * #MIN_BACKOFF_MS} ms doubling to {@value #MAX_BACKOFF_MS} ms, for up to {@value
 * #REOPEN_WAIT_MS} ms a call); the backoff carries over from one call to the next until a
 * session opens.
 *
 * <p>A broken stream loses nothing: the next one sends again what the daemon did not apply
 * ({@link SessionStream}), and leases in flight wait for it. When the daemon says it is moving
 * to its successor (MovingNotice), the stream is reattached as soon as it ends, without delay,
 * on a new connection ({@link #reconnect}).
 *
 * <p>Time comes from a {@link Ticker} and waits between attempts from a {@link Sleeper}, both
 * injected, so that the grace period and the backoff are tested without sleeping.
 *
 * <p>Thread-safe: the current session is a volatile field, replaced only under {@code
 * reopenLock} (taken before any of a session's locks); the backoff is guarded by that lock.
 * Stream events arrive on transport threads; reattaching and notice flushes run on one
 * scheduler thread ({@code gpumemd-client-keepalive}).
 */
final class SessionKeeper {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  static final long MIN_BACKOFF_MS = 50;
  static final long MAX_BACKOFF_MS = 2000;
  /** How soon a stream the moving daemon refused is reattached. */
  static final long MOVING_RETRY_MS = 10;
  /** How long a call waits for a new session after the old one was lost. */
  static final long REOPEN_WAIT_MS = 10_000;

  /** The client's one channel: its connection is replaced at once when the daemon moves ({@link #streamEnded}). */
  private final MovingChannel channel;
  private final AllocatorGrpc.AllocatorBlockingStub blocking;
  private final AllocatorGrpc.AllocatorStub async;
  /** What OpenSession asks for, again for each new session after a restart. */
  private final OpenSessionRequest openRequest;
  private final boolean keepAlive;
  private final boolean streamCalls;
  private final Ticker ticker;
  private final Sleeper sleeper;
  private final Consumer<Long> onShutdownNotice;
  private final ClientCounters counters;
  /** The client's fd channel, shared by its sessions' mappings. */
  private final FdChannelClient fdChannel;
  private final ScheduledExecutorService scheduler;
  /** Makes each new session's {@link Lease.Owner}; set by {@link #start}. */
  private Function<Session, Lease.Owner> owners;
  /** An admin's sleep and wake asks go there; set once before {@link #start}. */
  private AskedSleeps asked;
  private volatile Session session;
  private volatile boolean closing;
  private final Object reopenLock = new Object();
  private long reopenBackoffMs = MIN_BACKOFF_MS; // guarded by reopenLock
  private long nextReopenNanos; // guarded by reopenLock

  /**
   * @param keepAlive hold a KeepAlive stream for each session
   * @param streamCalls lease on that stream (and keep a client cache), not with unary calls
   */
  SessionKeeper(MovingChannel channel, OpenSessionRequest openRequest, boolean keepAlive, boolean streamCalls,
      Ticker ticker, Sleeper sleeper, Consumer<Long> onShutdownNotice, ClientCounters counters,
      FdChannelClient fdChannel) {
    this.channel = channel;
    this.blocking = AllocatorGrpc.newBlockingStub(channel);
    this.async = AllocatorGrpc.newStub(channel);
    this.openRequest = openRequest;
    this.keepAlive = keepAlive;
    this.streamCalls = streamCalls;
    this.ticker = ticker;
    this.sleeper = sleeper;
    this.onShutdownNotice = onShutdownNotice;
    this.counters = counters;
    this.fdChannel = fdChannel;
    // No thread starts until the first task.
    this.scheduler = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "gpumemd-client-keepalive");
      t.setDaemon(true);
      return t;
    });
  }

  /**
   * Opens the first session and its stream.
   *
   * @throws GpuMemException when the daemon cannot be reached or refuses the session
   */
  void start(Function<Session, Lease.Owner> owners) {
    this.owners = owners;
    OpenSessionResponse opened;
    try {
      opened = blocking.withDeadlineAfter(10, TimeUnit.SECONDS).openSession(openRequest);
    } catch (StatusRuntimeException e) {
      scheduler.shutdownNow();
      throw GpuMemException.from(e);
    }
    session = new Session(opened, 1, streamCalls, scheduler, counters, owners, fdChannel);
    attach(session);
  }

  /** Where an admin's sleep and wake asks go; called once, before {@link #start}. */
  void onSleepAsked(AskedSleeps asked) {
    this.asked = asked;
  }

  /** The current session, lost or not. */
  Session current() {
    return session;
  }

  boolean isClosing() {
    return closing;
  }

  /** Mappings opened since connect, by every session. */
  long mapsOpened() {
    return counters.earlierMapsOpened.get() + session.mappings.mapsOpened();
  }

  /**
   * The current session, or a new one when it was lost (the daemon restarted or ended it).
   *
   * @throws GpuMemException UNAVAILABLE when no new session could be opened in time, or the
   *     client is closed
   */
  Session live() {
    Session s = session;
    if (!s.isLost()) {
      return s;
    }
    if (closing) {
      throw closed();
    }
    synchronized (reopenLock) {
      return reopen();
    }
  }

  private Session reopen() {
    long deadline = ticker.nanos() + TimeUnit.MILLISECONDS.toNanos(REOPEN_WAIT_MS);
    GpuMemException last = null;
    while (true) {
      Session s = session;
      if (!s.isLost()) {
        return s; // another thread opened it meanwhile
      }
      if (closing) {
        throw closed();
      }
      long wait = nextReopenNanos - ticker.nanos();
      if (wait > 0) {
        if (ticker.nanos() + wait > deadline) {
          break;
        }
        pause(wait);
      }
      try {
        OpenSessionResponse opened = blocking.withDeadlineAfter(5, TimeUnit.SECONDS).openSession(openRequest);
        return replace(s, opened);
      } catch (StatusRuntimeException e) {
        last = GpuMemException.from(e);
        nextReopenNanos = ticker.nanos() + TimeUnit.MILLISECONDS.toNanos(reopenBackoffMs);
        reopenBackoffMs = Math.min(MAX_BACKOFF_MS, reopenBackoffMs * 2);
        if (ticker.nanos() >= deadline) {
          break;
        }
      }
    }
    throw new GpuMemException(Status.Code.UNAVAILABLE, "session lost: the daemon restarted or ended it, and no new "
        + "session could be opened yet" + (last == null ? "" : " (" + last.getMessage() + ")") + "; retry", last);
  }

  /** The new session replaces the lost one {@code s}; its stream is attached before others see it. */
  private Session replace(Session s, OpenSessionResponse opened) {
    assert Thread.holdsLock(reopenLock);
    Session next = new Session(opened, s.generation + 1, streamCalls, scheduler, counters, owners, fdChannel);
    counters.earlierMapsOpened.addAndGet(s.mappings.mapsOpened());
    reopenBackoffMs = MIN_BACKOFF_MS;
    nextReopenNanos = 0;
    log.info("gpumemd session {} lost; opened new session {} (generation {})", s.id, next.id, next.generation);
    attach(next); // before others see it, so that their leases find the stream attached
    session = next;
    return next;
  }

  private void pause(long nanos) {
    try {
      sleeper.sleep(nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new GpuMemException(Status.Code.CANCELLED, "interrupted while opening a new session", e);
    }
  }

  private static GpuMemException closed() {
    return new GpuMemException(Status.Code.UNAVAILABLE, "the client is closed", null);
  }

  /** Marks a session lost (once, see {@link Session#lose}); the next call opens a new one. */
  void lose(Session s, String why) {
    if (s.lose()) {
      log.warn("gpumemd session {} lost ({}); its leases are gone, the next lease opens a new session", s.id, why);
    }
  }

  /**
   * A unary call failed; without a KeepAlive stream, NOT_FOUND for the session is how the
   * client learns that the daemon restarted or expired it.
   */
  GpuMemException failed(Session s, Throwable t) {
    GpuMemException error = GpuMemException.from(t);
    if (!keepAlive && error.code() == Status.Code.NOT_FOUND
        && String.valueOf(error.getMessage()).contains("session " + s.id)) {
      lose(s, error.getMessage());
    }
    return error;
  }

  /**
   * While the session's stream is broken and being reattached (the daemon keeps the session
   * for its grace period), waits for the daemon to confirm a stream again or for the session to
   * be seen lost, up to the grace period plus a second, instead of sending the lease on a stream
   * that is down or not yet confirmed and failing it at once: a caller that retries on
   * UNAVAILABLE would otherwise spin through the whole grace period of a daemon restart.
   *
   * @return {@code s}, or a new session when {@code s} was lost meanwhile
   */
  Session awaitStream(Session s) {
    long deadline = ticker.nanos() + TimeUnit.MILLISECONDS.toNanos(s.graceMillis + 1000);
    try {
      s.stream.awaitAttached(deadline, ticker); // past it, the send fails with "stream is down; retry"
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new GpuMemException(Status.Code.CANCELLED, "interrupted while waiting for the KeepAlive stream", e);
    }
    return s.isLost() ? live() : s;
  }

  /** Opens the session's KeepAlive stream (if kept alive) and waits briefly for the attach. */
  private void attach(Session s) {
    if (!keepAlive) {
      return;
    }
    openStream(s);
    try {
      if (!s.firstAttach.await(10, TimeUnit.SECONDS)) {
        log.warn("gpumemd session {}: KeepAlive stream not attached after 10 s", s.id);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Opens a stream for {@code s}. */
  private void openStream(Session s) {
    if (closing) {
      return;
    }
    CountDownLatch done = new CountDownLatch(1);
    SessionEvents events = new SessionEvents(s, done, onShutdownNotice, status -> streamEnded(s, status), asked,
        channel::successorAt, channel::attached);
    s.stream.open(async::keepAlive, events, done, KeepAliveRequest.newBuilder().setSessionId(s.id).build());
  }

  /** The stream of {@code s} ended: the session is lost, or the stream is reattached within the grace period. */
  private void streamEnded(Session s, Status status) {
    boolean moving = s.stream.wasMoving();
    boolean noticed = s.stream.wasNoticed();
    long brokenSince = s.stream.broken(ticker.nanos());
    // Leases in flight stay pending: the next stream sends again what the daemon did not apply.
    if (closing || s.isLost()) {
      return;
    }
    if (moving) {
      // The daemon moved the session to its successor behind the same address: at once after its
      // MovingNotice; after a refused message, in a few milliseconds (the old daemon, still there
      // until its successor serves, refuses a new stream as well).
      boolean early = noticed && reconnect();
      try {
        scheduler.schedule(() -> openStream(s), noticed ? 0 : MOVING_RETRY_MS, TimeUnit.MILLISECONDS);
        if (noticed) {
          // Logged after the reattach began, on the scheduler's thread: on this transport thread, which
          // the new connection needs, a client's first log line took 12-17 ms (TakeOverPauseMain).
          scheduler.execute(() -> log.info("gpumemd is moving to its successor; session {} reattaches{}", s.id,
              early ? " over the connection made to it before the pause" : ""));
        }
      } catch (RejectedExecutionException e) {
        // closing
      }
      return;
    }
    if (status.getCode() == Status.Code.NOT_FOUND || status.isOk()) {
      lose(s, "ended by the daemon: " + (status.isOk() ? "stream completed" : status.getDescription()));
      return;
    }
    long elapsedMs = TimeUnit.NANOSECONDS.toMillis(ticker.nanos() - brokenSince);
    if (elapsedMs > s.graceMillis) {
      lose(s, "KeepAlive stream lost for " + elapsedMs + " ms, past the grace period: " + status);
      return;
    }
    // Within the grace period the daemon keeps the session: reattach.
    long delay = Math.max(20, Math.min(200, s.graceMillis / 10));
    try {
      scheduler.schedule(() -> openStream(s), delay, TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException e) {
      // closing
    }
  }

  /**
   * Moves the channel to the successor now, while the old stream's end is still being handled
   * ({@link MovingChannel#moveToSuccessor}): over the connection made to it before the pause when
   * there is one, else over a new one.
   *
   * @return true over the connection made before the pause
   */
  private boolean reconnect() {
    return !closing && channel.moveToSuccessor();
  }

  /**
   * The client is closing: later calls get UNAVAILABLE ("the client is closed"), leases waiting
   * for the stream give up, no new stream opens; the current one stays, and with it the
   * session, until {@link #close}. Idempotent.
   */
  void refuseCalls() {
    closing = true;
    session.stream.closing();
  }

  /**
   * Ends the current session: sends what is pending and ends its stream, then CloseSession (the
   * daemon releases whatever it still holds); drops the client cache and closes every mapping.
   * Later calls get UNAVAILABLE ("the client is closed").
   */
  void close() {
    refuseCalls();
    Session s;
    synchronized (reopenLock) { // a new session being opened is finished (or never started)
      s = session;
    }
    s.stream.closing();
    try {
      if (streamCalls && !s.isLost()) {
        // Applied by the daemon before CloseSession (another HTTP/2 stream, not ordered with this one).
        s.notices.finishStream(2000);
      }
      if (!s.isLost()) {
        blocking.withDeadlineAfter(5, TimeUnit.SECONDS)
            .closeSession(CloseSessionRequest.newBuilder().setSessionId(s.id).build());
      }
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() != Status.Code.NOT_FOUND && e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
        log.warn("gpumemd CloseSession failed: {}", e.getStatus());
      }
    } finally {
      s.stream.end();
      scheduler.shutdownNow();
      if (s.cache != null) {
        s.cache.drain(); // CloseSession took the cached leases back with the rest
      }
      s.mappings.closeAll();
    }
  }
}
