package io.gpumemd.server.grpc;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.CloseSessionResponse;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.ReleaseResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.session.LeaseRecord;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;

/**
 * The {@code Allocator} service: a thin translation between protobuf and the {@link
 * SessionRegistry}. Errors go through {@link StatusMapper}.
 *
 * <p>Threading: the server runs handlers on the transport thread (direct executor), which is
 * what makes a pool hit cheap. A lease that needs the backend (a miss, or zeroing) is handed to
 * {@code blockingExecutor} so that a slow allocation never stalls other calls on the event loop.
 */
public final class AllocatorService extends AllocatorGrpc.AllocatorImplBase {
  private final SessionRegistry registry;
  private final Executor blockingExecutor;
  private final ServerMetrics metrics;

  public AllocatorService(SessionRegistry registry, Executor blockingExecutor, ServerMetrics metrics) {
    this.registry = registry;
    this.blockingExecutor = blockingExecutor;
    this.metrics = metrics;
  }

  @Override
  public void openSession(OpenSessionRequest request, StreamObserver<OpenSessionResponse> response) {
    try {
      // ttl_seconds is a uint32: values past 2^31 arrive negative in Java; they mean "huge".
      int ttl = (int) Math.min(Integer.toUnsignedLong(request.getTtlSeconds()), Integer.MAX_VALUE);
      Session session = registry.open(request.getClientName(), ttl);
      response.onNext(OpenSessionResponse.newBuilder()
          .setSessionId(session.id())
          .setTtlSeconds(session.ttlSeconds())
          .setKeepaliveGraceMs((int) registry.settings().graceMillis())
          .setMaxLeasedBytes(session.quota().maxLeasedBytes())
          .setMaxLeases(session.quota().maxLeases())
          .build());
      response.onCompleted();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("OpenSession", e));
    }
  }

  @Override
  public StreamObserver<KeepAliveRequest> keepAlive(StreamObserver<SessionEvent> events) {
    StreamSessionChannel channel = new StreamSessionChannel((ServerCallStreamObserver<SessionEvent>) events);
    return new StreamObserver<>() {
      private Session session;

      @Override
      public void onNext(KeepAliveRequest message) {
        try {
          if (session == null) {
            session = registry.attach(message.getSessionId(), channel);
            channel.attached(session.id());
          } else if (!message.getSessionId().isEmpty() && !message.getSessionId().equals(session.id())) {
            throw Status.INVALID_ARGUMENT
                .withDescription("session_id: a KeepAlive stream serves one session (expected: "
                    + session.id() + " or empty)")
                .asRuntimeException();
          } else {
            registry.touch(session);
          }
          if (message.getUnmappedSegmentIdsCount() > 0) {
            registry.unmapped(session, message.getUnmappedSegmentIdsList());
          }
        } catch (RuntimeException e) {
          if (session != null) {
            registry.detach(session, channel);
          }
          channel.fail(StatusMapper.toStatus("KeepAlive", e));
        }
      }

      @Override
      public void onError(Throwable t) {
        if (session != null) {
          registry.detach(session, channel);
        }
      }

      @Override
      public void onCompleted() {
        if (session != null) {
          registry.detach(session, channel);
        }
        channel.close();
      }
    };
  }

  @Override
  public void closeSession(CloseSessionRequest request, StreamObserver<CloseSessionResponse> response) {
    try {
      long[] released = registry.close(request.getSessionId());
      response.onNext(CloseSessionResponse.newBuilder()
          .setReleasedLeases(released[0]).setReleasedBytes(released[1]).build());
      response.onCompleted();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("CloseSession", e));
    }
  }

  @Override
  public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
    long start = System.nanoTime();
    LeaseRecord lease;
    try {
      lease = registry.lease(request.getSessionId(), request.getDevice(), request.getSizeBytes(),
          request.getZero(), request.getTag(), true);
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("Lease", e));
      return;
    }
    if (lease != null) {
      respond(lease, start, response);
      return;
    }
    try {
      blockingExecutor.execute(() -> {
        try {
          respond(registry.lease(request.getSessionId(), request.getDevice(), request.getSizeBytes(),
              request.getZero(), request.getTag(), false), start, response);
        } catch (RuntimeException e) {
          response.onError(StatusMapper.toStatus("Lease", e));
        }
      });
    } catch (RejectedExecutionException e) {
      response.onError(Status.UNAVAILABLE.withDescription("gpumemd is shutting down").asRuntimeException());
    }
  }

  private void respond(LeaseRecord lease, long startNanos, StreamObserver<LeaseResponse> response) {
    LeaseResponse reply = ProtoMapping.leaseResponse(lease);
    // Recorded before the reply leaves: afterwards the client may already have released the
    // block and another lease be using it.
    metrics.recordLease(reply.getDevice(), reply.getPoolHit(), System.nanoTime() - startNanos);
    response.onNext(reply);
    response.onCompleted();
  }

  @Override
  public void release(ReleaseRequest request, StreamObserver<ReleaseResponse> response) {
    try {
      registry.release(request.getSessionId(), request.getLeaseId(), request.getCudaIpcEventHandle().toByteArray());
      response.onNext(ReleaseResponse.getDefaultInstance());
      response.onCompleted();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("Release", e));
    }
  }
}
