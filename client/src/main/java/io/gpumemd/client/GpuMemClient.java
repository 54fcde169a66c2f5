package io.gpumemd.client;

import com.google.protobuf.ByteString;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.LeaseReply;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.ReleaseResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.AttachResponse;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.PublishRequest;
import io.gpumemd.proto.v1.RevokeShareRequest;
import io.gpumemd.proto.v1.ShareRequest;
import io.gpumemd.proto.v1.ShareResponse;
import io.gpumemd.proto.v1.UnpublishRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.StreamObserver;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A connection to gpumemd with one session, kept alive in the background for as long as the
 * client is open. Lease memory with {@link #lease}; close the client to release everything the
 * session still holds and unmap every segment.
 *
 * <pre>{@code
 * try (GpuMemClient client = GpuMemClient.connect("unix:///tmp/gpumemd.sock");
 *      Lease lease = client.lease(0, 64 << 20)) {
 *   ByteBuffer memory = lease.buffer();   // host devices; devicePointer() on CUDA devices
 * }
 * }</pre>
 *
 * <p>The session is held by a KeepAlive stream: if this process dies, the daemon takes back
 * its leases after a short grace period. If the stream breaks, the client reattaches within
 * the grace period. Segment mappings are cached per segment id and closed when the daemon
 * asks ({@code UnmapSegment}) or when the client closes.
 *
 * <p>The stream is also the lease path: a lease the daemon serves is one round trip on it (a
 * {@code StreamLease} answered by a {@code LeaseReply}), and a release is a notice the caller
 * never waits for. Closed leases go to the client cache tier ({@link ClientCache}) within the
 * allowance the daemon grants, and serve later leases without a round trip; the daemon hears
 * of both in batched notices, sent at most a millisecond after the fact (at once when a lease
 * goes out anyway, or when the daemon asks for cached blocks back). {@link Builder#unaryCalls}
 * or {@code keepAlive(false)} use the unary calls instead, and no client cache.
 *
 * <p>If the daemon restarts (or ends the session), the client sees its session lost: when the
 * daemon ends the stream, or when the stream stays broken past the grace period. It then logs a
 * warning, and everything of that session is dropped: its leases are dead ({@link Lease#close()}
 * does nothing, {@link Lease#buffer()} throws "session lost"), its mappings and client cache are
 * dropped (a restarted daemon reuses segment ids), its pending notices are never sent. The next
 * lease opens a new session, retrying with backoff (50 ms doubling to 2 s, for up to 10 s a
 * call), so that a long-running worker goes on across a restart; {@link #sessionId()} is the
 * current session's. A lease asked for while the stream is broken but the session not yet seen
 * lost waits (up to the grace period plus a second) for the stream to be confirmed again or for
 * the loss, rather than failing at once.
 *
 * <p>Locks, always taken in this order: {@code reopenLock} (opening a new session), {@code streamLock} (sending on the stream), the client
 * cache's monitor (a take or an offer together with its notice), {@code noticeLock} (the
 * pending notices). Nothing is sent while the cache's monitor is held.
 *
 * <p>Thread-safe: any thread may lease and close leases concurrently.
 */
public final class GpuMemClient implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(GpuMemClient.class);

  private final Channels.Connection connection;
  private final AllocatorGrpc.AllocatorBlockingStub blocking;
  private final AllocatorGrpc.AllocatorStub async;
  private final Consumer<Long> onShutdownNotice;
  private final ScheduledExecutorService reconnector;
  private final Object streamLock = new Object();
  private volatile boolean closing;
  private final AtomicBoolean closeStarted = new AtomicBoolean();
  private final CountDownLatch closed = new CountDownLatch(1);
  private final boolean streamCalls;
  private final boolean keepAlive;
  /** What OpenSession asks for, again for each new session after a restart. */
  private final OpenSessionRequest openRequest;
  /** The current session; replaced (under reopenLock) once it is lost and a lease asks again. */
  private volatile Session session;
  private final Object reopenLock = new Object();
  /** Backoff between attempts to open a new session (guarded by reopenLock). */
  private long reopenBackoffMs = MIN_BACKOFF_MS;
  private long nextReopenNanos;
  private final AtomicLong nextRequestId = new AtomicLong(1);
  private final AtomicBoolean flushScheduled = new AtomicBoolean();
  private final AtomicLong daemonLeases = new AtomicLong();
  private final AtomicLong releases = new AtomicLong();
  /** Mappings opened by sessions before the current one. */
  private final AtomicLong earlierMapsOpened = new AtomicLong();

  static final long MIN_BACKOFF_MS = 50;
  static final long MAX_BACKOFF_MS = 2000;
  /** How long a lease waits for a new session after the old one was lost. */
  private static final long REOPEN_WAIT_MS = 10_000;

  /**
   * One session at the daemon and everything that belongs to it: its mappings (a restarted
   * daemon reuses segment ids), its client cache, its stream, its pending notices and leases.
   * A lease remembers its session: once that session is lost, the lease is dead, and closing
   * it touches nothing of a later session.
   */
  static final class Session {
    final String id;
    final long generation;
    final int ttlSeconds;
    final long graceMillis;
    final MappingCache mappings;
    /** Null on the unary path or when the daemon grants no allowance. */
    final ClientCache cache;
    final CountDownLatch firstAttach = new CountDownLatch(1);
    StreamObserver<KeepAliveRequest> stream; // guarded by streamLock
    /** The daemon confirmed the current stream (ATTACHED) and it has not ended; guarded by streamLock. */
    boolean attached;
    CountDownLatch streamDone; // guarded by streamLock: the current stream's end
    final AtomicBoolean lost = new AtomicBoolean();
    final Map<Long, CompletableFuture<LeaseResponse>> pendingLeases = new ConcurrentHashMap<>();
    /**
     * Notices not yet sent, guarded by noticeLock. Cache notices are kept as each lease's net
     * transition since the last send (a close into the cache and a reuse cancel out), so a
     * worker that leases and closes locally sends nothing at all; releases in order.
     */
    final Object noticeLock = new Object();
    final LinkedHashMap<String, Boolean> cacheNotices = new LinkedHashMap<>();
    final ArrayList<ReleaseNotice> releaseNotices = new ArrayList<>();
    /** {@link ClientCache#countersVersion()} as last sent; written under streamLock. */
    volatile long countersVersionSent;

    Session(OpenSessionResponse opened, long generation, boolean streamCalls, GpuMemClient client) {
      this.id = opened.getSessionId();
      this.generation = generation;
      this.ttlSeconds = opened.getTtlSeconds();
      this.graceMillis = opened.getKeepaliveGraceMs();
      this.mappings = new MappingCache(segmentId -> client.ackUnmapped(this, segmentId));
      this.cache = streamCalls && opened.getClientCacheBytes() > 0 ? new ClientCache(opened.getClientCacheBytes()) : null;
    }

    boolean isLost() {
      return lost.get();
    }
  }

  /** A release notice waiting to be sent. */
  private record ReleaseNotice(String leaseId, byte[] eventHandle) {}

  /** Notices per message, far below gRPC's 4 MiB message limit. */
  private static final int NOTICES_PER_MESSAGE = 4096;
  /** Pending notices at which the caller sends them itself instead of waiting for the flush. */
  private static final int FLUSH_AT = 1024;

  /** Builds a client; {@link #connect()} opens it. */
  public static final class Builder {
    private final String target;
    private String clientName = "pid-" + ProcessHandle.current().pid();
    private int ttlSeconds;
    private boolean keepAlive = true;
    private Consumer<Long> onShutdownNotice = drainMs -> { };
    private Long clientCacheBytes;
    private boolean unaryCalls;
    private Path caCert;
    private Path clientCert;
    private Path clientKey;
    private String bearerToken;

    private Builder(String target) {
      this.target = target;
    }

    /** Name shown by the daemon in logs and listings; selects per-client quotas. */
    public Builder clientName(String name) {
      this.clientName = name;
      return this;
    }

    /** Session TTL without keep-alive, in seconds (0 = the daemon's default). */
    public Builder ttlSeconds(int seconds) {
      this.ttlSeconds = seconds;
      return this;
    }

    /**
     * Whether to hold a KeepAlive stream (default true). Without it the session lives by its
     * TTL, refreshed by each call, and segments the daemon wants to free wait for it to end.
     */
    public Builder keepAlive(boolean keepAlive) {
      this.keepAlive = keepAlive;
      return this;
    }

    /**
     * Asks for at most this client cache allowance (0 turns the client cache tier off). By
     * default the client takes what the daemon grants. Closed leases stay mapped in the client,
     * within the allowance, and serve later leases that fit without a round trip.
     */
    public Builder clientCacheBytes(long bytes) {
      if (bytes < 0) {
        throw new IllegalArgumentException("clientCacheBytes: " + bytes + " (expected: >= 0)");
      }
      this.clientCacheBytes = bytes;
      return this;
    }

    /**
     * Uses the unary Lease and Release calls (two round trips a pair) instead of the session's
     * stream (one round trip a lease, releases not waited for). For comparison and for
     * daemons that predate the stream; default false.
     */
    public Builder unaryCalls(boolean unary) {
      this.unaryCalls = unary;
      return this;
    }

    /**
     * Connects over TLS (a {@code host:port} target only), trusting daemon certificates signed
     * by {@code caCert} (PEM). The certificate must name the target's host (a SAN).
     */
    public Builder tls(Path caCert) {
      this.caCert = Objects.requireNonNull(caCert, "caCert");
      this.clientCert = null;
      this.clientKey = null;
      return this;
    }

    /**
     * Mutual TLS: as {@link #tls(Path)}, presenting {@code clientCert} (PEM) with its PKCS#8
     * {@code clientKey}. The daemon names this client's tenant after the certificate's CN.
     */
    public Builder tls(Path caCert, Path clientCert, Path clientKey) {
      this.caCert = Objects.requireNonNull(caCert, "caCert");
      this.clientCert = Objects.requireNonNull(clientCert, "clientCert");
      this.clientKey = Objects.requireNonNull(clientKey, "clientKey");
      return this;
    }

    /**
     * Sends {@code authorization: Bearer <token>} on every call, the KeepAlive stream included:
     * the session then belongs to the token's tenant. Over TCP beyond loopback, use it with
     * {@link #tls} so that the token does not cross the network in clear text.
     */
    public Builder bearerToken(String token) {
      this.bearerToken = Objects.requireNonNull(token, "token");
      return this;
    }

    /** Called (on a transport thread) when the daemon announces its shutdown. */
    public Builder onShutdownNotice(Consumer<Long> callback) {
      this.onShutdownNotice = callback;
      return this;
    }

    /**
     * Connects and opens the session.
     *
     * @throws GpuMemException when the daemon cannot be reached or refuses the session
     */
    public GpuMemClient connect() {
      return new GpuMemClient(this);
    }
  }

  public static Builder builder(String target) {
    return new Builder(target);
  }

  /** Connects to {@code unix:///path/to.sock} or {@code host:port} with default options. */
  public static GpuMemClient connect(String target) {
    return builder(target).connect();
  }

  private GpuMemClient(Builder b) {
    this.connection = Channels.open(b.target, new Channels.Security(b.caCert, b.clientCert, b.clientKey, b.bearerToken));
    this.blocking = AllocatorGrpc.newBlockingStub(connection.channel());
    this.async = AllocatorGrpc.newStub(connection.channel());
    this.onShutdownNotice = b.onShutdownNotice;
    OpenSessionRequest.Builder open = OpenSessionRequest.newBuilder()
        .setClientName(b.clientName).setTtlSeconds(b.ttlSeconds);
    if (b.clientCacheBytes != null) {
      open.setClientCacheBytes(b.clientCacheBytes);
    }
    this.openRequest = open.build();
    this.keepAlive = b.keepAlive;
    this.streamCalls = b.keepAlive && !b.unaryCalls;
    OpenSessionResponse opened;
    try {
      opened = blocking.withDeadlineAfter(10, TimeUnit.SECONDS).openSession(openRequest);
    } catch (StatusRuntimeException e) {
      connection.close();
      throw GpuMemException.from(e);
    }
    this.reconnector = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "gpumemd-client-keepalive");
      t.setDaemon(true);
      return t;
    });
    this.session = new Session(opened, 1, streamCalls, this);
    attach(session);
  }

  /** Opens the session's KeepAlive stream (if kept alive) and waits briefly for the attach. */
  private void attach(Session s) {
    if (!keepAlive) {
      return;
    }
    openStream(s, System.nanoTime());
    try {
      if (!s.firstAttach.await(10, TimeUnit.SECONDS)) {
        log.warn("gpumemd session {}: KeepAlive stream not attached after 10 s", s.id);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * The current session, or a new one when it was lost (the daemon restarted or ended it): a new
   * session is opened here, retrying with backoff (50 ms doubling to 2 s) for up to 10 s.
   *
   * @throws GpuMemException UNAVAILABLE when no new session could be opened in that time
   */
  private Session liveSession() {
    Session s = session;
    if (!s.isLost()) {
      return s;
    }
    if (closing) {
      throw new GpuMemException(Status.Code.UNAVAILABLE, "the client is closed", null);
    }
    synchronized (reopenLock) {
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(REOPEN_WAIT_MS);
      GpuMemException last = null;
      while (true) {
        s = session;
        if (!s.isLost()) {
          return s; // another thread opened it meanwhile
        }
        if (closing) {
          throw new GpuMemException(Status.Code.UNAVAILABLE, "the client is closed", null);
        }
        long wait = nextReopenNanos - System.nanoTime();
        if (wait > 0) {
          if (System.nanoTime() + wait > deadline) {
            break;
          }
          try {
            TimeUnit.NANOSECONDS.sleep(wait);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new GpuMemException(Status.Code.CANCELLED, "interrupted while opening a new session", e);
          }
        }
        try {
          OpenSessionResponse opened = blocking.withDeadlineAfter(5, TimeUnit.SECONDS).openSession(openRequest);
          Session next = new Session(opened, s.generation + 1, streamCalls, this);
          earlierMapsOpened.addAndGet(s.mappings.mapsOpened());
          reopenBackoffMs = MIN_BACKOFF_MS;
          nextReopenNanos = 0;
          log.info("gpumemd session {} lost; opened new session {} (generation {})", s.id, next.id, next.generation);
          attach(next); // before others see it, so that their leases find the stream attached
          session = next;
          return next;
        } catch (StatusRuntimeException e) {
          last = GpuMemException.from(e);
          nextReopenNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(reopenBackoffMs);
          reopenBackoffMs = Math.min(MAX_BACKOFF_MS, reopenBackoffMs * 2);
          if (System.nanoTime() >= deadline) {
            break;
          }
        }
      }
      throw new GpuMemException(Status.Code.UNAVAILABLE, "session lost: the daemon restarted or ended it, and no new "
          + "session could be opened yet" + (last == null ? "" : " (" + last.getMessage() + ")") + "; retry", last);
    }
  }

  /**
   * Marks a session lost (once): its leases are dead, its pending leases fail, its notices are
   * dropped, its client cache is emptied and its mappings are dropped (segment ids of a restarted
   * daemon mean other segments). The next lease opens a new session.
   */
  private void loseSession(Session s, String why) {
    if (!s.lost.compareAndSet(false, true)) {
      return;
    }
    s.firstAttach.countDown();
    log.warn("gpumemd session {} lost ({}); its leases are gone, the next lease opens a new session", s.id, why);
    synchronized (streamLock) {
      streamLock.notifyAll(); // leases waiting for the stream open a new session instead
      if (s.stream != null) {
        try {
          s.stream.onCompleted();
        } catch (RuntimeException ignored) {
          // the stream is broken anyway
        }
        s.stream = null;
      }
    }
    failPending(s, Status.UNAVAILABLE.withDescription("session lost"));
    synchronized (s.noticeLock) {
      s.cacheNotices.clear();
      s.releaseNotices.clear();
    }
    if (s.cache != null) {
      synchronized (s.cache) {
        s.cache.drain();
      }
    }
    s.mappings.abandonAll();
  }

  private static void failPending(Session s, Status status) {
    for (Long id : s.pendingLeases.keySet()) {
      CompletableFuture<LeaseResponse> waiting = s.pendingLeases.remove(id);
      if (waiting != null) {
        waiting.completeExceptionally(new GpuMemException(Status.Code.UNAVAILABLE,
            "the KeepAlive stream to gpumemd broke (" + status.getCode()
            + (status.getDescription() == null ? "" : ": " + status.getDescription()) + "); retry", null));
      }
    }
  }

  /** The current session id (a bearer credential: do not log it where others can read it). */
  public String sessionId() {
    return session.id;
  }

  public int ttlSeconds() {
    return session.ttlSeconds;
  }

  /** The underlying connection, for other services on the same channel (health, Admin). */
  public Channels.Connection connection() {
    return connection;
  }

  /** Segments mapped in this process right now. */
  public int mappedSegments() {
    return session.mappings.size();
  }

  /** Mappings opened since connect; a pool hit on a mapped segment does not add one. */
  public long mapsOpened() {
    return earlierMapsOpened.get() + session.mappings.mapsOpened();
  }

  /** What the cache tier and the lease path did since connect (cache figures: this session's). */
  public ClientStats stats() {
    ClientCache cache = session.cache;
    if (cache == null) {
      return new ClientStats(0, 0, daemonLeases.get(), releases.get(), 0, 0, 0);
    }
    return new ClientStats(cache.localHits(), cache.localReturns(), daemonLeases.get(), releases.get(),
        cache.cachedBytes(), cache.cachedBlocks(), cache.allowance());
  }

  /**
   * True while the current session is lost (the daemon expired it, or restarted) and no new one
   * is open yet; the next lease opens one.
   */
  public boolean sessionLost() {
    return session.isLost();
  }

  // ---------------------------------------------------------------------------- leasing

  /** Leases {@code sizeBytes} on a device; contents unspecified. */
  public Lease lease(int device, long sizeBytes) {
    return lease(device, sizeBytes, false, "");
  }

  /**
   * Leases a block. When the daemon restarted (or ended the session), this opens a new session
   * first; leases of the old one are dead.
   *
   * @param zero zero the block before it is handed out
   * @param tag label shown in listings and leak warnings
   * @throws GpuMemException with the status code and the daemon's message
   */
  public Lease lease(int device, long sizeBytes, boolean zero, String tag) {
    Session current = liveSession();
    Lease local = leaseLocally(current, device, sizeBytes, zero, tag);
    if (local != null) {
      return local;
    }
    Session s = streamCalls ? awaitStream(current) : current;
    if (streamCalls) {
      CompletableFuture<LeaseResponse> reply = leaseOnStream(s, device, sizeBytes, zero, tag);
      try {
        return wrap(s, reply.get(), tag);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        // Nobody will take the lease if the daemon grants it after all: give it straight back.
        reply.thenAccept(granted -> releaseUnwrapped(s, granted.getLeaseId()));
        throw new GpuMemException(Status.Code.CANCELLED, "interrupted while waiting for a lease", e);
      } catch (ExecutionException e) {
        throw GpuMemException.from(e.getCause());
      }
    }
    LeaseResponse response;
    try {
      response = blocking.lease(request(s, device, sizeBytes, zero, tag));
    } catch (StatusRuntimeException e) {
      throw unaryFailed(s, e);
    }
    daemonLeases.incrementAndGet();
    return wrap(s, response, tag);
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
  private Session awaitStream(Session s) {
    synchronized (streamLock) {
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(s.graceMillis + 1000);
      while (!s.attached && !s.isLost() && !closing) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          break; // the send below fails with "stream is down; retry"
        }
        try {
          TimeUnit.NANOSECONDS.timedWait(streamLock, left);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new GpuMemException(Status.Code.CANCELLED, "interrupted while waiting for the KeepAlive stream", e);
        }
      }
    }
    return s.isLost() ? liveSession() : s;
  }

  /**
   * A unary call failed; without a KeepAlive stream, NOT_FOUND for the session is how the
   * client learns that the daemon restarted or expired it.
   */
  private GpuMemException unaryFailed(Session s, Throwable t) {
    GpuMemException error = GpuMemException.from(t);
    if (!keepAlive && error.code() == Status.Code.NOT_FOUND
        && String.valueOf(error.getMessage()).contains("session " + s.id)) {
      loseSession(s, error.getMessage());
    }
    return error;
  }

  /** A lease from the client's own cache, zeroed when asked, or null. */
  private Lease leaseLocally(Session s, int device, long sizeBytes, boolean zero, String tag) {
    ClientCache cache = s.cache;
    if (cache == null || closing || sizeBytes <= 0) {
      return null;
    }
    Lease cached;
    boolean flushNow;
    // The take and its notice are one step under the cache's monitor: a close of the same block
    // on another thread (offer and its notice) cannot come between them.
    synchronized (cache) {
      if (s.isLost()) {
        return null;
      }
      cached = cache.take(device, sizeBytes);
      if (cached == null) {
        return null;
      }
      flushNow = cacheNotice(s, cached.id(), true);
    }
    afterNotice(s, flushNow); // may send: outside the cache's monitor (send reads the counters)
    Lease lease = new Lease(cached, sizeBytes, tag);
    if (zero) {
      try {
        Zeroing.zero(lease);
      } catch (RuntimeException | LinkageError e) {
        lease.close();
        throw e;
      }
    }
    return lease;
  }

  /** Sends a StreamLease (with the notices queued so far); the future completes with the reply. */
  private CompletableFuture<LeaseResponse> leaseOnStream(Session s, int device, long sizeBytes, boolean zero, String tag) {
    long id = nextRequestId.getAndIncrement();
    CompletableFuture<LeaseResponse> reply = new CompletableFuture<>();
    s.pendingLeases.put(id, reply);
    KeepAliveRequest.Builder message = KeepAliveRequest.newBuilder().addLeases(StreamLease.newBuilder()
        .setRequestId(id).setDevice(device).setSizeBytes(sizeBytes).setZero(zero).setTag(tag));
    if (!send(s, message)) {
      s.pendingLeases.remove(id);
      reply.completeExceptionally(new GpuMemException(Status.Code.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
          + (s.isLost() ? " and the session is lost (the next lease opens a new one)" : "; retry"), null));
    }
    return reply;
  }

  /**
   * Leases without blocking the caller; the future fails with {@link GpuMemException}. (When the
   * session was lost, opening the new one happens on the calling thread.)
   */
  public CompletableFuture<Lease> leaseAsync(int device, long sizeBytes, boolean zero, String tag) {
    Session s;
    Lease local;
    try {
      s = liveSession();
      local = leaseLocally(s, device, sizeBytes, zero, tag);
    } catch (RuntimeException e) {
      return CompletableFuture.failedFuture(e);
    }
    if (local != null) {
      return CompletableFuture.completedFuture(local);
    }
    if (streamCalls) {
      return leaseOnStream(s, device, sizeBytes, zero, tag).thenApply(response -> wrap(s, response, tag));
    }
    CompletableFuture<Lease> result = new CompletableFuture<>();
    async.lease(request(s, device, sizeBytes, zero, tag), new StreamObserver<>() {
      @Override
      public void onNext(LeaseResponse response) {
        try {
          daemonLeases.incrementAndGet();
          result.complete(wrap(s, response, tag));
        } catch (RuntimeException e) {
          result.completeExceptionally(e);
        }
      }

      @Override
      public void onError(Throwable t) {
        result.completeExceptionally(unaryFailed(s, t));
      }

      @Override
      public void onCompleted() {}
    });
    return result;
  }

  private LeaseRequest request(Session s, int device, long sizeBytes, boolean zero, String tag) {
    return LeaseRequest.newBuilder().setSessionId(s.id).setDevice(device)
        .setSizeBytes(sizeBytes).setZero(zero).setTag(tag).build();
  }

  private Lease wrap(Session s, LeaseResponse response, String tag) {
    SegmentMapping mapping;
    try {
      if (s.isLost()) {
        throw new GpuMemException(Status.Code.UNAVAILABLE, "session lost while the lease was granted; retry", null);
      }
      mapping = s.mappings.acquire(response.getDevice(), response.getHandle());
    } catch (RuntimeException | LinkageError e) {
      // We cannot use the block; give it straight back so it is not held until session end.
      releaseQuietly(s, response.getLeaseId());
      if (e instanceof LinkageError) {
        throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "a CUDA lease needs JCuda and its "
            + "natives on the classpath (org.jcuda:jcuda): " + e, e);
      }
      throw e;
    }
    return new Lease(this, s, response, mapping, tag);
  }

  private void releaseQuietly(Session s, String leaseId) {
    if (s.isLost()) {
      return;
    }
    try {
      blocking.release(ReleaseRequest.newBuilder().setSessionId(s.id).setLeaseId(leaseId).build());
    } catch (StatusRuntimeException ignored) {
      // the session end will take it back
    }
  }

  /**
   * A lease was closed: into the cache, or released (a notice on the stream, a call if unary).
   * A release that carries a CUDA event is always a call: the caller destroys its event as soon
   * as this returns, and the daemon must have opened its own reference by then, which a notice
   * sent up to a millisecond later would not guarantee. A lease of a lost session is gone with
   * it: nothing to do.
   */
  void closeLease(Lease lease, byte[] eventHandle) {
    Session s = lease.session();
    if (s.isLost()) {
      return;
    }
    if (!streamCalls || eventHandle != null) {
      release(s, lease, eventHandle);
      return;
    }
    // A shared or published lease, or a hold, goes back to the daemon: others still use the block.
    ClientCache cache = lease.uncacheable() ? null : s.cache;
    if (cache != null && !closing) {
      List<Lease> evicted;
      boolean flushNow = false;
      synchronized (cache) { // the offer and its notice are one step, as in leaseLocally
        if (s.isLost()) {
          return;
        }
        evicted = cache.offer(lease);
        if (evicted != null) {
          flushNow = cacheNotice(s, lease.id(), false);
        }
      }
      if (evicted != null) {
        afterNotice(s, flushNow);
        for (Lease old : evicted) {
          releaseNotice(s, old, null);
        }
        return;
      }
    }
    releaseNotice(s, lease, eventHandle);
  }

  CompletableFuture<Void> closeLeaseAsync(Lease lease) {
    Session s = lease.session();
    if (s.isLost()) {
      return CompletableFuture.completedFuture(null);
    }
    if (!streamCalls) {
      return releaseAsync(s, lease, null);
    }
    closeLease(lease, null);
    return CompletableFuture.completedFuture(null);
  }

  /** Releases a granted lease that was never handed to the caller (nothing of it is mapped). */
  private void releaseUnwrapped(Session s, String leaseId) {
    afterNotice(s, queueRelease(s, leaseId, null));
  }

  private void releaseNotice(Session s, Lease lease, byte[] eventHandle) {
    boolean flushNow = queueRelease(s, lease.id(), eventHandle);
    s.mappings.release(lease.segmentId());
    afterNotice(s, flushNow);
  }

  /** Queues a release notice; true when the caller should send the pending notices now. */
  private boolean queueRelease(Session s, String leaseId, byte[] eventHandle) {
    releases.incrementAndGet();
    synchronized (s.noticeLock) {
      if (s.isLost()) {
        return false; // the daemon that granted it is gone
      }
      // A release supersedes a pending cache notice: the daemon releases a lease in either state.
      s.cacheNotices.remove(leaseId);
      s.releaseNotices.add(new ReleaseNotice(leaseId, eventHandle));
      return pendingNotices(s) >= FLUSH_AT;
    }
  }

  private void release(Session s, Lease lease, byte[] eventHandle) {
    releases.incrementAndGet();
    try {
      blocking.release(releaseRequest(s, lease, eventHandle));
    } catch (StatusRuntimeException e) {
      GpuMemException error = GpuMemException.from(e);
      // After the client or session is gone the daemon already took the lease back.
      if (!(closing || s.isLost()) || error.code() != Status.Code.NOT_FOUND) {
        throw error;
      }
    } finally {
      s.mappings.release(lease.segmentId());
    }
  }

  private CompletableFuture<Void> releaseAsync(Session s, Lease lease, byte[] eventHandle) {
    releases.incrementAndGet();
    CompletableFuture<Void> result = new CompletableFuture<>();
    async.release(releaseRequest(s, lease, eventHandle), new StreamObserver<>() {
      @Override
      public void onNext(ReleaseResponse value) {}

      @Override
      public void onError(Throwable t) {
        s.mappings.release(lease.segmentId());
        result.completeExceptionally(GpuMemException.from(t));
      }

      @Override
      public void onCompleted() {
        s.mappings.release(lease.segmentId());
        result.complete(null);
      }
    });
    return result;
  }

  private ReleaseRequest releaseRequest(Session s, Lease lease, byte[] eventHandle) {
    ReleaseRequest.Builder request = ReleaseRequest.newBuilder().setSessionId(s.id).setLeaseId(lease.id());
    if (eventHandle != null) {
      request.setCudaIpcEventHandle(ByteString.copyFrom(eventHandle));
    }
    return request.build();
  }

  // ---------------------------------------------------------------------------- sharing

  /** Deadline of the sharing calls (unary: they are rare, and make no backend call). */
  private static final long SHARING_DEADLINE_MS = 10_000;
  /**
   * How long Share and Publish of a lease served from the client cache retry while the daemon
   * still has it as cached: the notice that it is in use again travels on the stream, which is
   * not ordered with the unary call.
   */
  private static final long REUSE_NOTICE_WAIT_MS = 2_000;

  private AllocatorGrpc.AllocatorBlockingStub sharingStub() {
    return blocking.withDeadlineAfter(SHARING_DEADLINE_MS, TimeUnit.MILLISECONDS);
  }

  /** Lease#share: the token for a lease or hold of this client. */
  Share share(Lease lease, ShareOptions options) {
    Session s = lease.session();
    lease.markShared(); // before the call: a close meanwhile must not cache it
    ShareRequest request = ShareRequest.newBuilder().setSessionId(s.id).setLeaseId(lease.id())
        .setExpiresAfterSeconds((int) options.expiresAfter().getSeconds()).setReadOnly(options.readOnly())
        .setMaxAttaches(options.maxAttaches()).build();
    ShareResponse response = afterReuseNotice(s, lease, () -> sharingStub().share(request));
    return new Share(this, response.getToken(), response.getExpiresAfterSeconds(), options);
  }

  /**
   * Runs Share or Publish of a lease; one served from the client cache first has its reuse
   * notice sent, and is retried while the daemon still answers FAILED_PRECONDITION (it has not
   * read the notice yet), for up to {@link #REUSE_NOTICE_WAIT_MS}.
   */
  private <T> T afterReuseNotice(Session s, Lease lease, java.util.function.Supplier<T> call) {
    if (lease.localHit() && streamCalls) {
      flushNotices(s);
    }
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(REUSE_NOTICE_WAIT_MS);
    long backoffMs = 1;
    while (true) {
      try {
        return call.get();
      } catch (StatusRuntimeException e) {
        GpuMemException error = unaryFailed(s, e);
        if (!(lease.localHit() && error.code() == Status.Code.FAILED_PRECONDITION) || System.nanoTime() > deadline) {
          throw error;
        }
      }
      flushNotices(s);
      try {
        Thread.sleep(backoffMs);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new GpuMemException(Status.Code.CANCELLED, "interrupted while sharing lease " + lease.id(), e);
      }
      backoffMs = Math.min(50, backoffMs * 2);
    }
  }

  /** Share#revoke. */
  boolean revoke(String token) {
    Session s = liveSession();
    try {
      return sharingStub().revokeShare(RevokeShareRequest.newBuilder().setSessionId(s.id).setToken(token).build())
          .getBlockReturned();
    } catch (StatusRuntimeException e) {
      throw unaryFailed(s, e);
    }
  }

  /** Share#close: revokes, unless the token or the client is gone already. */
  void revokeQuietly(String token) {
    if (closing) {
      return; // the token outlives the client by design; revoke it before closing the client
    }
    try {
      revoke(token);
    } catch (GpuMemException e) {
      if (e.code() != Status.Code.NOT_FOUND) {
        throw e;
      }
    }
  }

  /** Attaches to a shared block by token; see {@link #attach(String, String)}. */
  public Lease attach(String token) {
    return attach(token, "");
  }

  /**
   * Takes a hold on the block a share token names: a {@link Lease} of this client on the same
   * memory ({@link Lease#attached()} true), read-only when the token is. Closing it releases
   * the hold (never into the client cache); the block returns to the pool when its last hold is
   * gone. The same client attaching twice holds twice.
   *
   * @param tag label shown in listings
   * @throws GpuMemException NOT_FOUND for an unknown, expired, revoked or used-up token (or
   *     another tenant's); RESOURCE_EXHAUSTED at the daemon's {@code --max-holds-per-session}
   */
  public Lease attach(String token, String tag) {
    Objects.requireNonNull(token, "token");
    Session s = liveSession();
    AttachResponse response;
    try {
      response = sharingStub().attach(AttachRequest.newBuilder().setSessionId(s.id).setToken(token)
          .setTag(tag).build());
    } catch (StatusRuntimeException e) {
      throw unaryFailed(s, e);
    }
    return wrapHold(s, response, tag);
  }

  /** Publishes a lease, writable for those who look it up; see {@link #publish(Lease, String, boolean)}. */
  public Published publish(Lease lease, String name) {
    return publish(lease, name, false);
  }

  /**
   * Publishes a lease (or hold) of this client under a name unique within its tenant. The name
   * holds the block until it is unpublished ({@link Published#close()}, {@link #unpublish},
   * {@code gpumemctl objects rm}), even after the lease is closed or this process exits; the
   * lease itself is then released to the daemon on close, never cached.
   *
   * @param name 1 to 256 printable characters (no control, format or separator characters), no leading
   *     or trailing white space (e.g. {@code "llama-3-8b/layer-0"})
   * @param readOnly lookups get read-only holds
   * @throws GpuMemException ALREADY_EXISTS for a name the tenant has published; INVALID_ARGUMENT
   *     for a bad name; RESOURCE_EXHAUSTED past the daemon's {@code --max-published-bytes} or
   *     {@code --max-shares-per-tenant}
   */
  public Published publish(Lease lease, String name, boolean readOnly) {
    Objects.requireNonNull(name, "name");
    if (lease.isClosed()) {
      throw new IllegalStateException("lease " + lease.id() + " is closed");
    }
    if (lease.isLost()) {
      throw new IllegalStateException("lease " + lease.id() + ": session lost: the daemon restarted or ended the session");
    }
    Session s = lease.session();
    lease.markShared();
    PublishRequest request = PublishRequest.newBuilder().setSessionId(s.id).setLeaseId(lease.id()).setName(name)
        .setReadOnly(readOnly).build();
    afterReuseNotice(s, lease, () -> sharingStub().publish(request));
    return new Published(this, name, readOnly);
  }

  /** Looks up a published object; see {@link #lookup(String, String)}. */
  public Lease lookup(String name) {
    return lookup(name, "");
  }

  /**
   * Takes a hold on the object published under {@code name} by this client's tenant: as
   * {@link #attach(String, String)} does for a token.
   *
   * @throws GpuMemException NOT_FOUND when no such object is published
   */
  public Lease lookup(String name, String tag) {
    Objects.requireNonNull(name, "name");
    Session s = liveSession();
    AttachResponse response;
    try {
      response = sharingStub().lookup(LookupRequest.newBuilder().setSessionId(s.id).setName(name).setTag(tag).build());
    } catch (StatusRuntimeException e) {
      throw unaryFailed(s, e);
    }
    return wrapHold(s, response, tag);
  }

  /**
   * Unpublishes a name of this client's tenant (whoever published it); holds taken by lookup
   * stay.
   *
   * @return true when the name was the block's last hold and it went back to the pool
   * @throws GpuMemException NOT_FOUND when no such object is published
   */
  public boolean unpublish(String name) {
    Objects.requireNonNull(name, "name");
    Session s = liveSession();
    try {
      return sharingStub().unpublish(UnpublishRequest.newBuilder().setSessionId(s.id).setName(name).build())
          .getBlockReturned();
    } catch (StatusRuntimeException e) {
      throw unaryFailed(s, e);
    }
  }

  /** Published#close: unpublishes, unless the name or the client is gone already. */
  void unpublishQuietly(String name) {
    if (closing) {
      return; // a name outlives the client by design
    }
    try {
      unpublish(name);
    } catch (GpuMemException e) {
      if (e.code() != Status.Code.NOT_FOUND) {
        throw e;
      }
    }
  }

  /** Maps a hold's segment (read-only when the hold is); a hold that cannot be mapped is released. */
  private Lease wrapHold(Session s, AttachResponse response, String tag) {
    LeaseResponse hold = response.getLease();
    SegmentMapping mapping;
    try {
      if (s.isLost()) {
        throw new GpuMemException(Status.Code.UNAVAILABLE, "session lost while the hold was granted; retry", null);
      }
      mapping = s.mappings.acquire(hold.getDevice(), hold.getHandle(), response.getReadOnly());
    } catch (RuntimeException | LinkageError e) {
      releaseQuietly(s, hold.getLeaseId());
      if (e instanceof LinkageError) {
        throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "a CUDA hold needs JCuda and its "
            + "natives on the classpath (org.jcuda:jcuda): " + e, e);
      }
      throw e;
    }
    return new Lease(this, s, hold, mapping, tag, true, response.getReadOnly());
  }

  // ---------------------------------------------------------------------------- keep-alive

  private void openStream(Session s, long firstTryNanos) {
    CountDownLatch done = new CountDownLatch(1);
    ClientResponseObserver<KeepAliveRequest, SessionEvent> events = new ClientResponseObserver<>() {
      @Override
      public void beforeStart(ClientCallStreamObserver<KeepAliveRequest> requests) {}

      @Override
      public void onNext(SessionEvent event) {
        if (s.isLost()) {
          return; // nothing of a lost session's stream concerns the client any more
        }
        ClientCache cache = s.cache;
        switch (event.getEventCase()) {
          case ATTACHED -> {
            synchronized (streamLock) {
              s.attached = true;
              streamLock.notifyAll(); // leases waiting for the stream (awaitStream)
            }
            s.firstAttach.countDown();
            flushNotices(s); // what queued up while the stream was away
          }
          case UNMAP -> s.mappings.unmapRequested(event.getUnmap().getSegmentId());
          case LEASE_REPLY -> leaseReplied(s, event.getLeaseReply());
          case RELEASE_FAILED -> log.warn("gpumemd refused a notice about lease {}: {} {}",
              event.getReleaseFailed().getLeaseId(), Status.fromCodeValue(event.getReleaseFailed().getError().getCode()).getCode(),
              event.getReleaseFailed().getError().getMessage());
          case RETURN_CACHE -> giveBack(s, cache == null ? List.of()
              : cache.giveBack(event.getReturnCache().getDevice(), event.getReturnCache().getBytes()));
          case CACHE_ALLOWANCE -> giveBack(s, cache == null ? List.of()
              : cache.setAllowance(event.getCacheAllowance().getBytes()));
          case SHUTDOWN -> {
            log.info("gpumemd is shutting down; drain timeout {} ms", event.getShutdown().getDrainTimeoutMs());
            // The daemon drains leases: cached ones go back now, closed ones from now on.
            if (cache != null) {
              giveBack(s, cache.setAllowance(0));
            }
            onShutdownNotice.accept(event.getShutdown().getDrainTimeoutMs());
          }
          default -> { }
        }
      }

      @Override
      public void onError(Throwable t) {
        done.countDown();
        streamEnded(s, Status.fromThrowable(t), firstTryNanos);
      }

      @Override
      public void onCompleted() {
        done.countDown();
        streamEnded(s, Status.OK, firstTryNanos);
      }
    };
    synchronized (streamLock) {
      if (closing || s.isLost()) {
        return;
      }
      s.streamDone = done;
      s.stream = async.keepAlive(events);
      s.stream.onNext(KeepAliveRequest.newBuilder().setSessionId(s.id).build());
    }
  }

  private void leaseReplied(Session s, LeaseReply reply) {
    CompletableFuture<LeaseResponse> waiting = s.pendingLeases.remove(reply.getRequestId());
    if (waiting == null) {
      log.warn("gpumemd answered lease request {}, which nobody waits for", reply.getRequestId());
      return;
    }
    if (reply.hasLease()) {
      daemonLeases.incrementAndGet();
      waiting.complete(reply.getLease());
    } else {
      waiting.completeExceptionally(new GpuMemException(Status.fromCodeValue(reply.getError().getCode()).getCode(),
          reply.getError().getMessage(), null));
    }
  }

  /** Releases cached leases the daemon asked for (or the allowance no longer covers), at once. */
  private void giveBack(Session s, List<Lease> leases) {
    for (Lease lease : leases) {
      releaseNotice(s, lease, null);
    }
    flushNotices(s);
  }

  private void streamEnded(Session s, Status status, long firstTryNanos) {
    synchronized (streamLock) {
      s.stream = null;
      s.attached = false;
    }
    // Leases in flight on the broken stream get no reply: fail them so that callers may retry.
    failPending(s, status);
    if (closing || s.isLost()) {
      return;
    }
    if (status.getCode() == Status.Code.NOT_FOUND || status.isOk()) {
      loseSession(s, "ended by the daemon: " + (status.isOk() ? "stream completed" : status.getDescription()));
      return;
    }
    long elapsedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - firstTryNanos);
    if (elapsedMs > s.graceMillis) {
      loseSession(s, "KeepAlive stream lost for " + elapsedMs + " ms, past the grace period: " + status);
      return;
    }
    // Within the grace period the daemon keeps the session: reattach.
    long delay = Math.max(20, Math.min(200, s.graceMillis / 10));
    try {
      reconnector.schedule(() -> openStream(s, firstTryNanos), delay, TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException e) {
      // closing
    }
  }

  // ---------------------------------------------------------------------------- notices

  /**
   * Records that the client cached a lease ({@code reused} false) or handed it out again, for
   * the next message; a pending opposite transition of the same lease cancels out.
   *
   * @return true when so many notices are pending that the caller should send them now (with
   *     {@link #afterNotice}, outside the cache's monitor)
   */
  private boolean cacheNotice(Session s, String leaseId, boolean reused) {
    synchronized (s.noticeLock) {
      Boolean pending = s.cacheNotices.remove(leaseId);
      if (pending == null) {
        s.cacheNotices.put(leaseId, reused);
      }
      return pendingNotices(s) >= FLUSH_AT;
    }
  }

  private static int pendingNotices(Session s) {
    assert Thread.holdsLock(s.noticeLock);
    return s.cacheNotices.size() + s.releaseNotices.size();
  }

  /**
   * Notices go with the next outgoing lease, or with a flush at most a millisecond later: a
   * close() costs a map update, not a message. Many pending notices are sent at once.
   */
  private void afterNotice(Session s, boolean flushNow) {
    if (flushNow) {
      flushNotices(s);
    } else if (flushScheduled.compareAndSet(false, true)) {
      try {
        // The current session: one that is not current is lost, and its notices are dropped.
        reconnector.schedule(() -> flushNotices(session), 1, TimeUnit.MILLISECONDS);
      } catch (RejectedExecutionException e) {
        flushScheduled.set(false); // closing: CloseSession takes everything back
      }
    }
  }

  private void flushNotices(Session s) {
    flushScheduled.set(false);
    boolean any;
    synchronized (s.noticeLock) {
      any = pendingNotices(s) > 0;
    }
    // Outside noticeLock: the cache's monitor is taken before noticeLock elsewhere.
    if (any || (s.cache != null && countersChanged(s))) {
      send(s, KeepAliveRequest.newBuilder());
    }
  }

  private static boolean countersChanged(Session s) {
    return s.cache.countersVersion() != s.countersVersionSent;
  }

  /**
   * Sends the pending notices and then {@code message} (which may carry a lease) on the stream,
   * with the cache counters if they changed; notices beyond one message's share go in messages
   * of their own, first.
   *
   * @return false when no stream is attached (the notices stay pending for the next one)
   */
  private boolean send(Session s, KeepAliveRequest.Builder message) {
    synchronized (streamLock) {
      if (s.stream == null || s.isLost()) {
        return false;
      }
      List<KeepAliveRequest.Builder> messages = new ArrayList<>(1);
      messages.add(KeepAliveRequest.newBuilder());
      synchronized (s.noticeLock) {
        int n = 0;
        for (Map.Entry<String, Boolean> notice : s.cacheNotices.entrySet()) {
          messageFor(messages, n++).addCacheNotices(
              CacheNotice.newBuilder().setLeaseId(notice.getKey()).setReused(notice.getValue()));
        }
        for (ReleaseNotice release : s.releaseNotices) {
          StreamRelease.Builder r = StreamRelease.newBuilder().setLeaseId(release.leaseId());
          if (release.eventHandle() != null) {
            r.setCudaIpcEventHandle(ByteString.copyFrom(release.eventHandle()));
          }
          messageFor(messages, n++).addReleases(r);
        }
        s.cacheNotices.clear();
        s.releaseNotices.clear();
      }
      KeepAliveRequest.Builder last = messages.get(messages.size() - 1).mergeFrom(message.build());
      // Cumulative counters, only after they changed (the daemon takes the difference).
      ClientCache cache = s.cache;
      if (cache != null && countersChanged(s)) {
        long version = cache.countersVersion();
        cache.counters().forEach((device, c) ->
            last.addClientCounters(ClientCacheCounters.newBuilder().setDevice(device).setHits(c[0]).setReturns(c[1])));
        s.countersVersionSent = version;
      }
      for (KeepAliveRequest.Builder m : messages) {
        s.stream.onNext(m.build());
      }
      return true;
    }
  }

  /**
   * Sends what is pending (releases, cache notices, counters) and ends the stream, waiting
   * briefly for the daemon to end its side: it has then applied all of it, before CloseSession
   * (another HTTP/2 stream, not ordered with this one) ends the session.
   */
  private void finishStream(Session s) {
    CountDownLatch done;
    synchronized (streamLock) {
      if (s.stream == null) {
        return;
      }
      send(s, KeepAliveRequest.newBuilder());
      s.stream.onCompleted();
      s.stream = null;
      done = s.streamDone;
    }
    try {
      done.await(2, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** The message the {@code n}-th notice goes in: a new one every {@link #NOTICES_PER_MESSAGE}. */
  private static KeepAliveRequest.Builder messageFor(List<KeepAliveRequest.Builder> messages, int n) {
    if (n > 0 && n % NOTICES_PER_MESSAGE == 0) {
      messages.add(KeepAliveRequest.newBuilder());
    }
    return messages.get(messages.size() - 1);
  }

  /** Acknowledges an unmap on the stream of the session whose mapping it was. */
  private void ackUnmapped(Session s, long segmentId) {
    synchronized (streamLock) {
      if (s.stream != null && !s.isLost()) {
        s.stream.onNext(KeepAliveRequest.newBuilder().addUnmappedSegmentIds(segmentId).build());
      }
    }
  }

  // ---------------------------------------------------------------------------- closing

  /**
   * Closes the session (the daemon releases whatever it still holds), unmaps every segment and
   * closes the connection. Idempotent, also under concurrent calls: one caller closes, the
   * others wait until it has finished, so that every call returns with the client closed.
   */
  @Override
  public void close() {
    if (!closeStarted.compareAndSet(false, true)) {
      awaitClosed();
      return;
    }
    closing = true;
    synchronized (streamLock) {
      streamLock.notifyAll(); // leases waiting for the stream give up
    }
    Session s;
    synchronized (reopenLock) { // a new session being opened is finished (or never started)
      s = session;
    }
    try {
      if (streamCalls && !s.isLost()) {
        finishStream(s);
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
      synchronized (streamLock) {
        if (s.stream != null) {
          s.stream.onCompleted();
          s.stream = null;
        }
      }
      reconnector.shutdownNow();
      if (s.cache != null) {
        s.cache.drain(); // CloseSession took the cached leases back with the rest
      }
      s.mappings.closeAll();
      connection.close();
      closed.countDown();
    }
  }

  private void awaitClosed() {
    try {
      closed.await();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
