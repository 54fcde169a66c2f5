package io.gpumemd.client;

import com.google.protobuf.ByteString;
import io.gpumemd.proto.v1.AllocatorGrpc;
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
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
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
  private volatile boolean closing;
  private final AtomicBoolean closeStarted = new AtomicBoolean();
  private final CountDownLatch closed = new CountDownLatch(1);
  private volatile boolean sessionLost;

  /** Builds a client; {@link #connect()} opens it. */
  public static final class Builder {
    private final String target;
    private String clientName = "pid-" + ProcessHandle.current().pid();
    private int ttlSeconds;
    private boolean keepAlive = true;
    private Consumer<Long> onShutdownNotice = drainMs -> { };
    private Long clientCacheBytes;
    private boolean unaryCalls;

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
    this.connection = Channels.open(b.target);
    this.blocking = AllocatorGrpc.newBlockingStub(connection.channel());
    this.async = AllocatorGrpc.newStub(connection.channel());
    this.onShutdownNotice = b.onShutdownNotice;
    this.mappings = new MappingCache(this::ackUnmapped);
    OpenSessionResponse opened;
    try {
      opened = blocking.withDeadlineAfter(10, TimeUnit.SECONDS).openSession(OpenSessionRequest.newBuilder()
          .setClientName(b.clientName).setTtlSeconds(b.ttlSeconds).build());
    } catch (StatusRuntimeException e) {
      connection.close();
      throw GpuMemException.from(e);
    }
    this.sessionId = opened.getSessionId();
    this.ttlSeconds = opened.getTtlSeconds();
    this.graceMillis = opened.getKeepaliveGraceMs();
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
    throw new UnsupportedOperationException("not yet");
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
    LeaseResponse response;
    try {
      response = blocking.lease(request(device, sizeBytes, zero, tag));
    } catch (StatusRuntimeException e) {
      throw GpuMemException.from(e);
    }
    return wrap(response);
  }

  /** Leases without blocking the caller; the future fails with {@link GpuMemException}. */
  public CompletableFuture<Lease> leaseAsync(int device, long sizeBytes, boolean zero, String tag) {
    CompletableFuture<Lease> result = new CompletableFuture<>();
    async.lease(request(device, sizeBytes, zero, tag), new StreamObserver<>() {
      @Override
      public void onNext(LeaseResponse response) {
        try {
          result.complete(wrap(response));
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

  private Lease wrap(LeaseResponse response) {
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
    return new Lease(this, response, mapping);
  }

  private void releaseQuietly(String leaseId) {
    try {
      blocking.release(ReleaseRequest.newBuilder().setSessionId(sessionId).setLeaseId(leaseId).build());
    } catch (StatusRuntimeException ignored) {
      // the session end will take it back
    }
  }

  void release(Lease lease, byte[] eventHandle) {
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

  CompletableFuture<Void> releaseAsync(Lease lease, byte[] eventHandle) {
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
    ClientResponseObserver<KeepAliveRequest, SessionEvent> events = new ClientResponseObserver<>() {
      @Override
      public void beforeStart(ClientCallStreamObserver<KeepAliveRequest> requests) {}

      @Override
      public void onNext(SessionEvent event) {
        switch (event.getEventCase()) {
          case ATTACHED -> firstAttach.countDown();
          case UNMAP -> mappings.unmapRequested(event.getUnmap().getSegmentId());
          case SHUTDOWN -> {
            log.info("gpumemd is shutting down; drain timeout {} ms", event.getShutdown().getDrainTimeoutMs());
            onShutdownNotice.accept(event.getShutdown().getDrainTimeoutMs());
          }
          default -> { }
        }
      }

      @Override
      public void onError(Throwable t) {
        streamEnded(Status.fromThrowable(t), firstTryNanos);
      }

      @Override
      public void onCompleted() {
        streamEnded(Status.OK, firstTryNanos);
      }
    };
    synchronized (streamLock) {
      if (closing) {
        return;
      }
      stream = async.keepAlive(events);
      stream.onNext(KeepAliveRequest.newBuilder().setSessionId(sessionId).build());
    }
  }

  private void streamEnded(Status status, long firstTryNanos) {
    synchronized (streamLock) {
      stream = null;
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
