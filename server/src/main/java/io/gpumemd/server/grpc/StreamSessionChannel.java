package io.gpumemd.server.grpc;

import io.gpumemd.proto.v1.CacheAllowance;
import io.gpumemd.proto.v1.LeaseReply;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ReleaseFailed;
import io.gpumemd.proto.v1.ReturnCache;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamError;
import io.grpc.Status;
import io.gpumemd.proto.v1.ShutdownNotice;
import io.gpumemd.proto.v1.StreamAttached;
import io.gpumemd.proto.v1.UnmapSegment;
import io.gpumemd.server.session.SessionChannel;
import io.grpc.stub.ServerCallStreamObserver;

/**
 * A session's KeepAlive stream as a {@link SessionChannel}. gRPC observers are not
 * thread-safe and events come from any thread (pools, the reaper, shutdown), so every write
 * is serialized on this object; a closed channel drops further events.
 */
final class StreamSessionChannel implements SessionChannel {
  private final ServerCallStreamObserver<SessionEvent> stream;
  private boolean closed;

  StreamSessionChannel(ServerCallStreamObserver<SessionEvent> stream) {
    this.stream = stream;
  }

  synchronized void attached(String sessionId) {
    send(SessionEvent.newBuilder().setAttached(StreamAttached.newBuilder().setSessionId(sessionId)).build());
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

  private void send(SessionEvent event) {
    if (!closed && !stream.isCancelled()) {
      stream.onNext(event);
    }
  }

  @Override
  public synchronized void close() {
    if (!closed) {
      closed = true;
      if (!stream.isCancelled()) {
        stream.onCompleted();
      }
    }
  }

  synchronized void fail(Throwable error) {
    if (!closed) {
      closed = true;
      if (!stream.isCancelled()) {
        stream.onError(error);
      }
    }
  }

  synchronized boolean isClosed() {
    return closed;
  }
}
