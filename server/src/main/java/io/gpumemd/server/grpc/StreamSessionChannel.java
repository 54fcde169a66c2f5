package io.gpumemd.server.grpc;

import io.gpumemd.proto.v1.CacheAllowance;
import io.gpumemd.proto.v1.LeaseReply;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ReleaseFailed;
import io.gpumemd.proto.v1.ReturnCache;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamError;
import io.grpc.Status;
import io.gpumemd.proto.v1.MovingNotice;
import io.gpumemd.proto.v1.SuccessorNotice;
import io.gpumemd.proto.v1.ShutdownNotice;
import io.gpumemd.proto.v1.StreamAttached;
import io.gpumemd.proto.v1.UnmapSegment;
import io.gpumemd.server.session.SessionChannel;
import io.grpc.stub.ServerCallStreamObserver;

/**
 * A session's KeepAlive stream as a {@link SessionChannel}. gRPC observers are not
 * thread-safe and events come from any thread (pools, the reaper, shutdown), so every write
 * is serialized on this object; a closed channel drops further events.
 *
 * <p>It also tells the {@link StreamWatchdog} when a write leaves the transport holding more
 * unsent replies than it takes ({@code isReady()} false: the client is not reading), and
 * when the stream takes replies again ({@link #ready}); blocked past the stall timeout, the
 * watchdog has it closed by {@code onStall}.
 */
final class StreamSessionChannel implements SessionChannel {
  private final ServerCallStreamObserver<SessionEvent> stream;
  private final StreamWatchdog watchdog;
  /** Closes the stream for a client that stopped reading (the stream knows its session). */
  private final Runnable onStall;
  private boolean closed;
  private boolean blocked;
  private long blockedSinceNanos;

  StreamSessionChannel(ServerCallStreamObserver<SessionEvent> stream, StreamWatchdog watchdog, Runnable onStall) {
    this.stream = stream;
    this.watchdog = watchdog;
    this.onStall = onStall;
  }

  /** @param appliedMessages the session's KeepAlive messages applied before this stream's first */
  synchronized void attached(String sessionId, long appliedMessages) {
    send(SessionEvent.newBuilder().setAttached(
        StreamAttached.newBuilder().setSessionId(sessionId).setAppliedMessages(appliedMessages)).build());
  }

  @Override
  public synchronized void requestUnmap(int device, long segmentId) {
    send(SessionEvent.newBuilder()
        .setUnmap(UnmapSegment.newBuilder().setDevice(device).setSegmentId(segmentId)).build());
  }

  @Override
  public synchronized void returnCache(int device, long bytes) {
    send(SessionEvent.newBuilder().setReturnCache(ReturnCache.newBuilder().setDevice(device).setBytes(bytes)).build());
  }

  @Override
  public synchronized void cacheAllowance(long bytes) {
    send(SessionEvent.newBuilder().setCacheAllowance(CacheAllowance.newBuilder().setBytes(bytes)).build());
  }

  @Override
  public synchronized void sleepAsked(long requestId, boolean wake, int level, java.util.List<String> tags) {
    send(SessionEvent.newBuilder().setSleepAsked(io.gpumemd.proto.v1.SleepAsked.newBuilder().setRequestId(requestId)
        .setWake(wake).setLevel(level).addAllTags(tags)).build());
  }

  /** Answers a StreamLease with its lease. */
  synchronized void leaseReply(long requestId, LeaseResponse lease) {
    send(SessionEvent.newBuilder().setLeaseReply(LeaseReply.newBuilder().setRequestId(requestId).setLease(lease)).build());
  }

  /** Answers a StreamLease with the status the unary Lease would have returned. */
  synchronized void leaseRefused(long requestId, Status status) {
    send(SessionEvent.newBuilder().setLeaseReply(LeaseReply.newBuilder().setRequestId(requestId)
        .setError(error(status))).build());
  }

  /** Reports a release notice (or cache notice) about a lease that failed. */
  synchronized void releaseFailed(String leaseId, Status status) {
    send(SessionEvent.newBuilder().setReleaseFailed(ReleaseFailed.newBuilder().setLeaseId(leaseId)
        .setError(error(status))).build());
  }

  private static StreamError error(Status status) {
    return StreamError.newBuilder().setCode(status.getCode().value())
        .setMessage(status.getDescription() == null ? "" : status.getDescription()).build();
  }

  @Override
  public synchronized void shutdownNotice(long drainMillis) {
    send(SessionEvent.newBuilder().setShutdown(ShutdownNotice.newBuilder().setDrainTimeoutMs(drainMillis)).build());
  }

  @Override
  public synchronized void moving() {
    send(SessionEvent.newBuilder().setMoving(MovingNotice.getDefaultInstance()).build());
    close();
  }

  @Override
  public synchronized void successorAt(String socketName) {
    send(SessionEvent.newBuilder().setSuccessor(SuccessorNotice.newBuilder().setSocketName(socketName)).build());
  }

  private void send(SessionEvent event) {
    if (!closed && !stream.isCancelled()) {
      stream.onNext(event);
      if (!blocked && !stream.isReady()) {
        blocked = true;
        blockedSinceNanos = watchdog.blocked(this);
      }
    }
  }

  /** The transport takes replies again (the stream's onReady). */
  synchronized void ready() {
    if (blocked) {
      blocked = false;
      watchdog.unblocked(this);
    }
  }

  /**
   * Closes the stream through {@code onStall} when it has been blocked for {@code limitNanos}
   * or more.
   *
   * @return true when this channel is closed (now or before): the watchdog forgets it
   */
  boolean closeIfStalled(long nowNanos, long limitNanos) {
    synchronized (this) {
      if (closed) {
        return true;
      }
      if (!blocked || nowNanos - blockedSinceNanos < limitNanos) {
        return false;
      }
    }
    onStall.run();
    return true;
  }

  @Override
  public synchronized void close() {
    if (!closed) {
      closed = true;
      watchdog.unblocked(this);
      if (!stream.isCancelled()) {
        stream.onCompleted();
      }
    }
  }

  synchronized void fail(Throwable error) {
    if (!closed) {
      closed = true;
      watchdog.unblocked(this);
      if (!stream.isCancelled()) {
        stream.onError(error);
      }
    }
  }

  long stallMillis() {
    return watchdog.stallMillis();
  }
}
