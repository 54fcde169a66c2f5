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
 * <p>Locks, always taken in this order: {@code streamLock} (sending on the stream), the client
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
  private final String sessionId;
  private final int ttlSeconds;
  private final long graceMillis;
  private final MappingCache mappings;
  private final Consumer<Long> onShutdownNotice;
  private final ScheduledExecutorService reconnector;
  private final CountDownLatch firstAttach = new CountDownLatch(1);
  private final Object streamLock = new Object();
  private StreamObserver<KeepAliveRequest> stream; // guarded by streamLock
  private CountDownLatch streamDone; // guarded by streamLock: the current stream's end
  private volatile boolean closing;
  private final AtomicBoolean closeStarted = new AtomicBoolean();
  private final CountDownLatch closed = new CountDownLatch(1);
  private volatile boolean sessionLost;
  /** Null on the unary path or when the daemon grants no allowance. */
  private final ClientCache cache;
  private final boolean streamCalls;
  private final AtomicLong nextRequestId = new AtomicLong(1);
  private final Map<Long, CompletableFuture<LeaseResponse>> pendingLeases = new ConcurrentHashMap<>();
  /**
   * Notices not yet sent, guarded by noticeLock. Cache notices are kept as each lease's net
   * transition since the last send (a close into the cache and a reuse cancel out), so a worker
   * that leases and closes locally sends nothing at all; releases in order.
   */
  private final Object noticeLock = new Object();
  private final LinkedHashMap<String, Boolean> cacheNotices = new LinkedHashMap<>();
  private final ArrayList<ReleaseNotice> releaseNotices = new ArrayList<>();
  private final AtomicBoolean flushScheduled = new AtomicBoolean();
  private final AtomicLong daemonLeases = new AtomicLong();
  private final AtomicLong releases = new AtomicLong();
  /** Counters last sent, so that unchanged ones are not repeated. */
  /** {@link ClientCache#countersVersion()} as last sent; written under streamLock. */
  private volatile long countersVersionSent;

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
    this.mappings = new MappingCache(this::ackUnmapped);
    OpenSessionResponse opened;
    try {
      OpenSessionRequest.Builder open = OpenSessionRequest.newBuilder()
          .setClientName(b.clientName).setTtlSeconds(b.ttlSeconds);
      if (b.clientCacheBytes != null) {
        open.setClientCacheBytes(b.clientCacheBytes);
      }
      opened = blocking.withDeadlineAfter(10, TimeUnit.SECONDS).openSession(open.build());
    } catch (StatusRuntimeException e) {
      connection.close();
      throw GpuMemException.from(e);
    }
    this.sessionId = opened.getSessionId();
    this.ttlSeconds = opened.getTtlSeconds();
    this.graceMillis = opened.getKeepaliveGraceMs();
    this.streamCalls = b.keepAlive && !b.unaryCalls;
    this.cache = streamCalls && opened.getClientCacheBytes() > 0 ? new ClientCache(opened.getClientCacheBytes()) : null;
    this.reconnector = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "gpumemd-client-keepalive");
      t.setDaemon(true);
      return t;
    });
    if (b.keepAlive) {
      openStream(System.nanoTime());
      try {
        if (!firstAttach.await(10, TimeUnit.SECONDS)) {
          log.warn("gpumemd session {}: KeepAlive stream not attached after 10 s", sessionId);
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** The session id (a bearer credential: do not log it where others can read it). */
  public String sessionId() {
    return sessionId;
  }

  public int ttlSeconds() {
    return ttlSeconds;
  }

  /** The underlying connection, for other services on the same channel (health, Admin). */
  public Channels.Connection connection() {
    return connection;
  }

  /** Segments mapped in this process right now. */
  public int mappedSegments() {
    return mappings.size();
  }

  /** Mappings opened since connect; a pool hit on a mapped segment does not add one. */
  public long mapsOpened() {
    return mappings.mapsOpened();
  }

  /** What the cache tier and the lease path did since connect. */
  public ClientStats stats() {
    if (cache == null) {
      return new ClientStats(0, 0, daemonLeases.get(), releases.get(), 0, 0, 0);
    }
    return new ClientStats(cache.localHits(), cache.localReturns(), daemonLeases.get(), releases.get(),
        cache.cachedBytes(), cache.cachedBlocks(), cache.allowance());
  }

  /** True once the daemon ended the session (expired, or the server restarted). */
  public boolean sessionLost() {
    return sessionLost;
  }

  // ---------------------------------------------------------------------------- leasing

  /** Leases {@code sizeBytes} on a device; contents unspecified. */
  public Lease lease(int device, long sizeBytes) {
    return lease(device, sizeBytes, false, "");
  }

  /**
   * Leases a block.
   *
   * @param zero zero the block before it is handed out
   * @param tag label shown in listings and leak warnings
   * @throws GpuMemException with the status code and the daemon's message
   */
  public Lease lease(int device, long sizeBytes, boolean zero, String tag) {
    Lease local = leaseLocally(device, sizeBytes, zero, tag);
    if (local != null) {
      return local;
    }
    if (streamCalls) {
      CompletableFuture<LeaseResponse> reply = leaseOnStream(device, sizeBytes, zero, tag);
      try {
        return wrap(reply.get(), tag);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        // Nobody will take the lease if the daemon grants it after all: give it straight back.
        reply.thenAccept(granted -> releaseUnwrapped(granted.getLeaseId()));
        throw new GpuMemException(Status.Code.CANCELLED, "interrupted while waiting for a lease", e);
      } catch (ExecutionException e) {
        throw GpuMemException.from(e.getCause());
      }
    }
    LeaseResponse response;
    try {
      response = blocking.lease(request(device, sizeBytes, zero, tag));
    } catch (StatusRuntimeException e) {
      throw GpuMemException.from(e);
    }
    daemonLeases.incrementAndGet();
    return wrap(response, tag);
  }

  /** A lease from the client's own cache, zeroed when asked, or null. */
  private Lease leaseLocally(int device, long sizeBytes, boolean zero, String tag) {
    if (cache == null || closing || sizeBytes <= 0) {
      return null;
    }
    Lease cached;
    boolean flushNow;
    // The take and its notice are one step under the cache's monitor: a close of the same block
    // on another thread (offer and its notice) cannot come between them.
    synchronized (cache) {
      cached = cache.take(device, sizeBytes);
      if (cached == null) {
        return null;
      }
      flushNow = cacheNotice(cached.id(), true);
    }
    afterNotice(flushNow); // may send: outside the cache's monitor (send reads the counters)
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
  private CompletableFuture<LeaseResponse> leaseOnStream(int device, long sizeBytes, boolean zero, String tag) {
    long id = nextRequestId.getAndIncrement();
    CompletableFuture<LeaseResponse> reply = new CompletableFuture<>();
    pendingLeases.put(id, reply);
    KeepAliveRequest.Builder message = KeepAliveRequest.newBuilder().addLeases(StreamLease.newBuilder()
        .setRequestId(id).setDevice(device).setSizeBytes(sizeBytes).setZero(zero).setTag(tag));
    if (!send(message)) {
      pendingLeases.remove(id);
      reply.completeExceptionally(new GpuMemException(Status.Code.UNAVAILABLE,
          "the KeepAlive stream to gpumemd is down" + (sessionLost ? " and the session is lost" : "; retry"), null));
    }
    return reply;
  }

  /** Leases without blocking the caller; the future fails with {@link GpuMemException}. */
  public CompletableFuture<Lease> leaseAsync(int device, long sizeBytes, boolean zero, String tag) {
    Lease local;
    try {
      local = leaseLocally(device, sizeBytes, zero, tag);
    } catch (RuntimeException e) {
      return CompletableFuture.failedFuture(e);
    }
    if (local != null) {
      return CompletableFuture.completedFuture(local);
    }
    if (streamCalls) {
      return leaseOnStream(device, sizeBytes, zero, tag).thenApply(response -> wrap(response, tag));
    }
    CompletableFuture<Lease> result = new CompletableFuture<>();
    async.lease(request(device, sizeBytes, zero, tag), new StreamObserver<>() {
      @Override
      public void onNext(LeaseResponse response) {
        try {
          daemonLeases.incrementAndGet();
          result.complete(wrap(response, tag));
        } catch (RuntimeException e) {
          result.completeExceptionally(e);
        }
      }

      @Override
      public void onError(Throwable t) {
        result.completeExceptionally(GpuMemException.from(t));
      }

      @Override
      public void onCompleted() {}
    });
    return result;
  }

  private LeaseRequest request(int device, long sizeBytes, boolean zero, String tag) {
    return LeaseRequest.newBuilder().setSessionId(sessionId).setDevice(device)
        .setSizeBytes(sizeBytes).setZero(zero).setTag(tag).build();
  }

  private Lease wrap(LeaseResponse response, String tag) {
    SegmentMapping mapping;
    try {
      mapping = mappings.acquire(response.getDevice(), response.getHandle());
    } catch (RuntimeException | LinkageError e) {
      // We cannot use the block; give it straight back so it is not held until session end.
      releaseQuietly(response.getLeaseId());
      if (e instanceof LinkageError) {
        throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "a CUDA lease needs JCuda and its "
            + "natives on the classpath (org.jcuda:jcuda): " + e, e);
      }
      throw e;
    }
    return new Lease(this, response, mapping, tag);
  }

  private void releaseQuietly(String leaseId) {
    try {
      blocking.release(ReleaseRequest.newBuilder().setSessionId(sessionId).setLeaseId(leaseId).build());
    } catch (StatusRuntimeException ignored) {
      // the session end will take it back
    }
  }

  /**
   * A lease was closed: into the cache, or released (a notice on the stream, a call if unary).
   * A release that carries a CUDA event is always a call: the caller destroys its event as soon
   * as this returns, and the daemon must have opened its own reference by then, which a notice
   * sent up to a millisecond later would not guarantee.
   */
  void closeLease(Lease lease, byte[] eventHandle) {
    if (!streamCalls || eventHandle != null) {
      release(lease, eventHandle);
      return;
    }
    if (eventHandle == null && cache != null && !closing) {
      List<Lease> evicted;
      boolean flushNow = false;
      synchronized (cache) { // the offer and its notice are one step, as in leaseLocally
        evicted = cache.offer(lease);
        if (evicted != null) {
          flushNow = cacheNotice(lease.id(), false);
        }
      }
      if (evicted != null) {
        afterNotice(flushNow);
        for (Lease old : evicted) {
          releaseNotice(old, null);
        }
        return;
      }
    }
    releaseNotice(lease, eventHandle);
  }

  CompletableFuture<Void> closeLeaseAsync(Lease lease) {
    if (!streamCalls) {
      return releaseAsync(lease, null);
    }
    closeLease(lease, null);
    return CompletableFuture.completedFuture(null);
  }

  /** Releases a granted lease that was never handed to the caller (nothing of it is mapped). */
  private void releaseUnwrapped(String leaseId) {
    afterNotice(queueRelease(leaseId, null));
  }

  private void releaseNotice(Lease lease, byte[] eventHandle) {
    boolean flushNow = queueRelease(lease.id(), eventHandle);
    mappings.release(lease.segmentId());
    afterNotice(flushNow);
  }

  /** Queues a release notice; true when the caller should send the pending notices now. */
  private boolean queueRelease(String leaseId, byte[] eventHandle) {
    releases.incrementAndGet();
    synchronized (noticeLock) {
      // A release supersedes a pending cache notice: the daemon releases a lease in either state.
      cacheNotices.remove(leaseId);
      releaseNotices.add(new ReleaseNotice(leaseId, eventHandle));
      return pendingNotices() >= FLUSH_AT;
    }
  }

  private void release(Lease lease, byte[] eventHandle) {
    releases.incrementAndGet();
    try {
      blocking.release(releaseRequest(lease, eventHandle));
    } catch (StatusRuntimeException e) {
      GpuMemException error = GpuMemException.from(e);
      // After the client or session is gone the daemon already took the lease back.
      if (!(closing || sessionLost) || error.code() != Status.Code.NOT_FOUND) {
        throw error;
      }
    } finally {
      mappings.release(lease.segmentId());
    }
  }

  private CompletableFuture<Void> releaseAsync(Lease lease, byte[] eventHandle) {
    releases.incrementAndGet();
    CompletableFuture<Void> result = new CompletableFuture<>();
    async.release(releaseRequest(lease, eventHandle), new StreamObserver<>() {
      @Override
      public void onNext(ReleaseResponse value) {}

      @Override
      public void onError(Throwable t) {
        mappings.release(lease.segmentId());
        result.completeExceptionally(GpuMemException.from(t));
      }

      @Override
      public void onCompleted() {
        mappings.release(lease.segmentId());
        result.complete(null);
      }
    });
    return result;
  }

  private ReleaseRequest releaseRequest(Lease lease, byte[] eventHandle) {
    ReleaseRequest.Builder request = ReleaseRequest.newBuilder().setSessionId(sessionId).setLeaseId(lease.id());
    if (eventHandle != null) {
      request.setCudaIpcEventHandle(ByteString.copyFrom(eventHandle));
    }
    return request.build();
  }

  // ---------------------------------------------------------------------------- keep-alive

  private void openStream(long firstTryNanos) {
    CountDownLatch done = new CountDownLatch(1);
    ClientResponseObserver<KeepAliveRequest, SessionEvent> events = new ClientResponseObserver<>() {
      @Override
      public void beforeStart(ClientCallStreamObserver<KeepAliveRequest> requests) {}

      @Override
      public void onNext(SessionEvent event) {
        switch (event.getEventCase()) {
          case ATTACHED -> {
            firstAttach.countDown();
            flushNotices(); // what queued up while the stream was away
          }
          case UNMAP -> mappings.unmapRequested(event.getUnmap().getSegmentId());
          case LEASE_REPLY -> leaseReplied(event.getLeaseReply());
          case RELEASE_FAILED -> log.warn("gpumemd refused a notice about lease {}: {} {}",
              event.getReleaseFailed().getLeaseId(), Status.fromCodeValue(event.getReleaseFailed().getError().getCode()).getCode(),
              event.getReleaseFailed().getError().getMessage());
          case RETURN_CACHE -> giveBack(cache == null ? List.of()
              : cache.giveBack(event.getReturnCache().getDevice(), event.getReturnCache().getBytes()));
          case CACHE_ALLOWANCE -> giveBack(cache == null ? List.of()
              : cache.setAllowance(event.getCacheAllowance().getBytes()));
          case SHUTDOWN -> {
            log.info("gpumemd is shutting down; drain timeout {} ms", event.getShutdown().getDrainTimeoutMs());
            // The daemon drains leases: cached ones go back now, closed ones from now on.
            if (cache != null) {
              giveBack(cache.setAllowance(0));
            }
            onShutdownNotice.accept(event.getShutdown().getDrainTimeoutMs());
          }
          default -> { }
        }
      }

      @Override
      public void onError(Throwable t) {
        done.countDown();
        streamEnded(Status.fromThrowable(t), firstTryNanos);
      }

      @Override
      public void onCompleted() {
        done.countDown();
        streamEnded(Status.OK, firstTryNanos);
      }
    };
    synchronized (streamLock) {
      if (closing) {
        return;
      }
      streamDone = done;
      stream = async.keepAlive(events);
      stream.onNext(KeepAliveRequest.newBuilder().setSessionId(sessionId).build());
    }
  }

  private void leaseReplied(LeaseReply reply) {
    CompletableFuture<LeaseResponse> waiting = pendingLeases.remove(reply.getRequestId());
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
  private void giveBack(List<Lease> leases) {
    for (Lease lease : leases) {
      releaseNotice(lease, null);
    }
    flushNotices();
  }

  private void streamEnded(Status status, long firstTryNanos) {
    synchronized (streamLock) {
      stream = null;
    }
    // Leases in flight on the broken stream get no reply: fail them so that callers may retry.
    for (Long id : pendingLeases.keySet()) {
      CompletableFuture<LeaseResponse> waiting = pendingLeases.remove(id);
      if (waiting != null) {
        waiting.completeExceptionally(new GpuMemException(Status.Code.UNAVAILABLE,
            "the KeepAlive stream to gpumemd broke (" + status.getCode() + "); retry", null));
      }
    }
    if (closing) {
      return;
    }
    if (status.getCode() == Status.Code.NOT_FOUND || status.isOk()) {
      sessionLost = true;
      firstAttach.countDown();
      log.warn("gpumemd session {} ended by the daemon ({}); leases of this client are gone",
          sessionId, status.isOk() ? "stream completed" : status.getDescription());
      return;
    }
    long elapsedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - firstTryNanos);
    if (elapsedMs > graceMillis) {
      sessionLost = true;
      firstAttach.countDown();
      log.warn("gpumemd session {}: KeepAlive stream lost for {} ms ({}); giving up", sessionId, elapsedMs, status);
      return;
    }
    // Within the grace period the daemon keeps the session: reattach.
    long delay = Math.max(20, Math.min(200, graceMillis / 10));
    reconnector.schedule(() -> openStream(firstTryNanos), delay, TimeUnit.MILLISECONDS);
  }

  // ---------------------------------------------------------------------------- notices

  /**
   * Records that the client cached a lease ({@code reused} false) or handed it out again, for
   * the next message; a pending opposite transition of the same lease cancels out.
   *
   * @return true when so many notices are pending that the caller should send them now (with
   *     {@link #afterNotice}, outside the cache's monitor)
   */
  private boolean cacheNotice(String leaseId, boolean reused) {
    synchronized (noticeLock) {
      Boolean pending = cacheNotices.remove(leaseId);
      if (pending == null) {
        cacheNotices.put(leaseId, reused);
      }
      return pendingNotices() >= FLUSH_AT;
    }
  }

  private int pendingNotices() {
    assert Thread.holdsLock(noticeLock);
    return cacheNotices.size() + releaseNotices.size();
  }

  /**
   * Notices go with the next outgoing lease, or with a flush at most a millisecond later: a
   * close() costs a map update, not a message. Many pending notices are sent at once.
   */
  private void afterNotice(boolean flushNow) {
    if (flushNow) {
      flushNotices();
    } else if (flushScheduled.compareAndSet(false, true)) {
      try {
        reconnector.schedule(this::flushNotices, 1, TimeUnit.MILLISECONDS);
      } catch (RejectedExecutionException e) {
        flushScheduled.set(false); // closing: CloseSession takes everything back
      }
    }
  }

  private void flushNotices() {
    flushScheduled.set(false);
    boolean any;
    synchronized (noticeLock) {
      any = pendingNotices() > 0;
    }
    // Outside noticeLock: the cache's monitor is taken before noticeLock elsewhere.
    if (any || (cache != null && countersChanged())) {
      send(KeepAliveRequest.newBuilder());
    }
  }

  private boolean countersChanged() {
    return cache.countersVersion() != countersVersionSent;
  }

  /**
   * Sends the pending notices and then {@code message} (which may carry a lease) on the stream,
   * with the cache counters if they changed; notices beyond one message's share go in messages
   * of their own, first.
   *
   * @return false when no stream is attached (the notices stay pending for the next one)
   */
  private boolean send(KeepAliveRequest.Builder message) {
    synchronized (streamLock) {
      if (stream == null) {
        return false;
      }
      List<KeepAliveRequest.Builder> messages = new ArrayList<>(1);
      messages.add(KeepAliveRequest.newBuilder());
      synchronized (noticeLock) {
        int n = 0;
        for (Map.Entry<String, Boolean> notice : cacheNotices.entrySet()) {
          messageFor(messages, n++).addCacheNotices(
              CacheNotice.newBuilder().setLeaseId(notice.getKey()).setReused(notice.getValue()));
        }
        for (ReleaseNotice release : releaseNotices) {
          StreamRelease.Builder r = StreamRelease.newBuilder().setLeaseId(release.leaseId());
          if (release.eventHandle() != null) {
            r.setCudaIpcEventHandle(ByteString.copyFrom(release.eventHandle()));
          }
          messageFor(messages, n++).addReleases(r);
        }
        cacheNotices.clear();
        releaseNotices.clear();
      }
      KeepAliveRequest.Builder last = messages.get(messages.size() - 1).mergeFrom(message.build());
      // Cumulative counters, only after they changed (the daemon takes the difference).
      if (cache != null && countersChanged()) {
        long version = cache.countersVersion();
        cache.counters().forEach((device, c) ->
            last.addClientCounters(ClientCacheCounters.newBuilder().setDevice(device).setHits(c[0]).setReturns(c[1])));
        countersVersionSent = version;
      }
      for (KeepAliveRequest.Builder m : messages) {
        stream.onNext(m.build());
      }
      return true;
    }
  }

  /**
   * Sends what is pending (releases, cache notices, counters) and ends the stream, waiting
   * briefly for the daemon to end its side: it has then applied all of it, before CloseSession
   * (another HTTP/2 stream, not ordered with this one) ends the session.
   */
  private void finishStream() {
    CountDownLatch done;
    synchronized (streamLock) {
      if (stream == null) {
        return;
      }
      send(KeepAliveRequest.newBuilder());
      stream.onCompleted();
      stream = null;
      done = streamDone;
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

  private void ackUnmapped(long segmentId) {
    synchronized (streamLock) {
      if (stream != null) {
        stream.onNext(KeepAliveRequest.newBuilder().addUnmappedSegmentIds(segmentId).build());
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
    try {
      if (streamCalls && !sessionLost) {
        finishStream();
      }
      if (!sessionLost) {
        blocking.withDeadlineAfter(5, TimeUnit.SECONDS)
            .closeSession(CloseSessionRequest.newBuilder().setSessionId(sessionId).build());
      }
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() != Status.Code.NOT_FOUND && e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
        log.warn("gpumemd CloseSession failed: {}", e.getStatus());
      }
    } finally {
      synchronized (streamLock) {
        if (stream != null) {
          stream.onCompleted();
          stream = null;
        }
      }
      reconnector.shutdownNow();
      if (cache != null) {
        cache.drain(); // CloseSession took the cached leases back with the rest
      }
      mappings.closeAll();
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
