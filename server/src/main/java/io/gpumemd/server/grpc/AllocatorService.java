package io.gpumemd.server.grpc;

import static io.gpumemd.server.grpc.UnaryCalls.answer;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.AttachResponse;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.PublishRequest;
import io.gpumemd.proto.v1.PublishResponse;
import io.gpumemd.proto.v1.RevokeShareRequest;
import io.gpumemd.proto.v1.RevokeShareResponse;
import io.gpumemd.proto.v1.ShareRequest;
import io.gpumemd.proto.v1.ShareResponse;
import io.gpumemd.proto.v1.UnpublishRequest;
import io.gpumemd.proto.v1.UnpublishResponse;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.CloseSessionResponse;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.SizeClassRules;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.ReleaseResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.SleepRequest;
import io.gpumemd.proto.v1.SleepResponse;
import io.gpumemd.proto.v1.WakeRequest;
import io.gpumemd.proto.v1.WakeResponse;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.error.GpumemdException;
import io.gpumemd.server.error.StatusMapper;
import io.gpumemd.server.fd.DescriptorPushes;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.session.PendingLease;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSleep;
import io.gpumemd.server.session.SleepAsks;
import io.gpumemd.proto.v1.StreamError;
import io.gpumemd.server.takeover.HandOverGate;
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.server.books.Validation;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.Supplier;
import java.util.concurrent.RejectedExecutionException;

/**
 * The {@code Allocator} service: a thin translation between protobuf and the {@link
 * SessionRegistry}. Errors go through {@link StatusMapper}.
 *
 * <p>Threading: the server runs handlers on the transport thread (direct executor), which is
 * what makes a pool hit cheap. A lease that needs the backend (a miss, or zeroing) is handed to
 * {@code blockingExecutor} so that a slow allocation never stalls other calls on the event loop.
 * The sharing calls ({@link SharedObjects}) make no backend call but a release: they run on
 * the transport thread like Release.
 */
public final class AllocatorService extends AllocatorGrpc.AllocatorImplBase {
  /** The pools' size classes as clients' cache tiers need them: one source, SizeClasses. */
  private static final SizeClassRules SIZE_CLASSES = SizeClassRules.newBuilder()
      .setAlignmentBytes(SizeClasses.ALIGNMENT)
      .setSmallMaxBytes(SizeClasses.SMALL_MAX)
      .setSmallSegmentBytes(SizeClasses.SEGMENT_GRANULE)
      .build();

  private final SessionRegistry registry;
  /** Share tokens and published names: Share, Revoke, Attach, Publish, Lookup, Unpublish. */
  private final SharedObjects sharing;
  private final Executor blockingExecutor;
  private final ServerMetrics metrics;
  private final StreamWatchdog streams;
  private final HandOverGate gate;
  /** Pushes a new segment's descriptor before a Lease reply ({@code --host-segments fd}); null: none. */
  private final DescriptorPushes pushes;

  /** A service whose gate never closes (no take-over): in-process daemons of the tests. */
  public AllocatorService(SessionRegistry registry, Executor blockingExecutor, ServerMetrics metrics,
      StreamWatchdog streams) {
    this(registry, blockingExecutor, metrics, streams, HandOverGate.ALWAYS_OPEN);
  }

  /**
   * @param gate what each KeepAlive message passes before it is applied (unary calls pass it in
   *     {@link io.gpumemd.server.takeover.HandOverInterceptor})
   */
  public AllocatorService(SessionRegistry registry, Executor blockingExecutor, ServerMetrics metrics,
      StreamWatchdog streams, HandOverGate gate) {
    this(registry, blockingExecutor, metrics, streams, gate, null);
  }

  /** @param pushes the fd channel's bindings, pushed on before each Lease reply (null: no fd channel) */
  public AllocatorService(SessionRegistry registry, Executor blockingExecutor, ServerMetrics metrics,
      StreamWatchdog streams, HandOverGate gate, DescriptorPushes pushes) {
    this.pushes = pushes;
    this.gate = gate;
    this.registry = registry;
    this.sharing = registry.sharing();
    this.blockingExecutor = blockingExecutor;
    this.metrics = metrics;
    this.streams = streams;
  }

  @Override
  public void openSession(OpenSessionRequest request, StreamObserver<OpenSessionResponse> response) {
    try {
      // ttl_seconds is a uint32: values past 2^31 arrive negative in Java; they mean "huge".
      int ttl = (int) Math.min(Integer.toUnsignedLong(request.getTtlSeconds()), Integer.MAX_VALUE);
      Session session = registry.open(Callers.current(), request.getClientName(), ttl,
          request.hasClientCacheBytes() ? Validation.byteCount("client_cache_bytes", request.getClientCacheBytes()) : -1);
      OpenSessionResponse.Builder out = OpenSessionResponse.newBuilder();
      registry.pools().all().forEach(pool -> out.addDevices(ProtoMapping.deviceInfo(pool)));
      response.onNext(out
          .setSessionId(session.id())
          .setTtlSeconds(session.ttlSeconds())
          .setKeepaliveGraceMs((int) registry.settings().graceMillis())
          .setMaxLeasedBytes(session.quota().maxLeasedBytes())
          .setMaxLeases(session.quota().maxLeases())
          .setClientCacheBytes(session.cacheAllowance())
          .setMaxOversizeBytes(registry.pools().maxOversizeBytes())
          .setSizeClasses(SIZE_CLASSES)
          .build());
      response.onCompleted();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("OpenSession", e));
    }
  }

  @Override
  public StreamObserver<KeepAliveRequest> keepAlive(StreamObserver<SessionEvent> events) {
    return new SessionStream(registry, this, (ServerCallStreamObserver<SessionEvent>) events, Callers.current(),
        streams, gate);
  }

  @Override
  public void closeSession(CloseSessionRequest request, StreamObserver<CloseSessionResponse> response) {
    try {
      long[] released = registry.close(Callers.current(), request.getSessionId());
      response.onNext(CloseSessionResponse.newBuilder()
          .setReleasedLeases(released[0]).setReleasedBytes(released[1]).build());
      response.onCompleted();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("CloseSession", e));
    }
  }

  @Override
  public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
    serveLease(Callers.current(), request.getSessionId(), request.getDevice(), request.getSizeBytes(), request.getZero(),
        request.getTag(), reply -> {
          response.onNext(reply);
          response.onCompleted();
        }, response::onError);
  }

  /**
   * Serves a lease, unary or on a session stream: checked and its quota reserved once on the
   * calling (transport) thread, a pool hit served there too, anything that needs the backend
   * handed with its reservation to the blocking executor. Exactly one of the callbacks runs,
   * once.
   */
  void serveLease(Caller caller, String sessionId, int device, long size, boolean zero, String tag,
      Consumer<LeaseResponse> reply, Consumer<StatusRuntimeException> refuse) {
    long start = System.nanoTime();
    PendingLease pending;
    try {
      pending = registry.beginLease(caller, sessionId, device, size, zero, tag);
    } catch (RuntimeException e) {
      refuse.accept(StatusMapper.toStatus("Lease", e));
      return;
    }
    LeaseRecord hit;
    try {
      hit = registry.leaseCached(pending);
    } catch (RuntimeException e) {
      pending.close();
      refuse.accept(StatusMapper.toStatus("Lease", e));
      return;
    }
    if (hit != null) {
      reply.accept(respond(hit, start));
      return;
    }
    try {
      blockingExecutor.execute(() -> serveFromBackend(pending, start, reply, refuse));
    } catch (RejectedExecutionException e) {
      pending.close();
      refuse.accept(Status.UNAVAILABLE.withDescription("gpumemd is shutting down").asRuntimeException());
    }
  }

  private void serveFromBackend(PendingLease pending, long start, Consumer<LeaseResponse> reply,
      Consumer<StatusRuntimeException> refuse) {
    LeaseResponse response;
    try (pending) {
      response = respond(registry.leaseFromBackend(pending), start);
    } catch (RuntimeException e) {
      refuse.accept(StatusMapper.toStatus("Lease", e));
      return;
    }
    reply.accept(response);
  }

  private LeaseResponse respond(LeaseRecord lease, long startNanos) {
    LeaseResponse reply = ProtoMapping.leaseResponse(lease);
    if (pushes != null) {
      pushes.beforeLeaseReply(lease.session().id(), lease.block().segmentId());
    }
    // Recorded before the reply leaves: afterwards the client may already have released the
    // block and another lease be using it.
    metrics.recordLease(reply.getDevice(), reply.getPoolHit(), System.nanoTime() - startNanos);
    return reply;
  }

  @Override
  public void release(ReleaseRequest request, StreamObserver<ReleaseResponse> response) {
    try {
      registry.release(Callers.current(), request.getSessionId(), request.getLeaseId(), request.getCudaIpcEventHandle().toByteArray());
      response.onNext(ReleaseResponse.getDefaultInstance());
      response.onCompleted();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("Release", e));
    }
  }

  // ------------------------------------------------------------------------------ sleep and wake

  /** With admin_request_id, it answers an admin's SleepSession ({@link SleepAsks}): the admin gets the outcome. */
  @Override
  public void sleep(SleepRequest request, StreamObserver<SleepResponse> response) {
    Caller caller = Callers.current();
    answerBlocking("Sleep", response, () -> answering(caller, request.getSessionId(), request.getAdminRequestId(),
        false, request.hasRefused() ? request.getRefused() : null, SleepResponse.getDefaultInstance(), () -> {
          long start = System.nanoTime();
          SessionSleep.Slept slept = registry.sleep().sleep(caller, request.getSessionId(), request.getLevel(),
              request.getTagsList(), request.getVacatedSegmentIdsList());
          metrics.recordSleep(System.nanoTime() - start);
          return slept;
        }, AllocatorService::sleepResponse));
  }

  /** As {@link #sleep}, for an admin's WakeSession. */
  @Override
  public void wake(WakeRequest request, StreamObserver<WakeResponse> response) {
    Caller caller = Callers.current();
    answerBlocking("Wake", response, () -> answering(caller, request.getSessionId(), request.getAdminRequestId(),
        true, request.hasRefused() ? request.getRefused() : null, WakeResponse.getDefaultInstance(), () -> {
          long start = System.nanoTime();
          List<SessionSleep.Woken> woken = registry.sleep().wake(caller, request.getSessionId());
          metrics.recordWake(System.nanoTime() - start);
          return woken;
        }, AllocatorService::wakeResponse));
  }

  /**
   * Runs a Sleep or Wake, and when it answers admin request {@code adminRequestId} (not 0) gives
   * the admin its outcome: its result, the daemon's refusal of it, or the client's {@code
   * refused} (then nothing runs and the client gets {@code none}). A request no longer awaited is
   * refused before anything runs.
   */
  private <D, R> R answering(Caller caller, String sessionId, long adminRequestId, boolean wake, StreamError refused,
      R none, Supplier<D> body, Function<D, R> reply) {
    if (adminRequestId == 0) {
      return reply.apply(body.get());
    }
    SleepAsks.Ask ask = registry.sleep().asks().claim(caller, sessionId, adminRequestId, wake);
    if (refused != null) {
      Status.Code code = Status.fromCodeValue(refused.getCode()).getCode();
      ask.failed((code == Status.Code.OK ? Status.UNKNOWN : Status.fromCode(code)).withDescription("session "
          + sessionId + "'s client refused the admin's " + (wake ? "wake" : "sleep") + ": " + refused.getMessage())
          .asRuntimeException());
      return none;
    }
    try {
      D done = body.get();
      ask.answered(done);
      return reply.apply(done);
    } catch (RuntimeException e) {
      // A domain refusal reads as the client's; anything else is logged once, by the client's answer.
      Status status = e instanceof GpumemdException ? StatusMapper.toStatus(wake ? "Wake" : "Sleep", e).getStatus()
          : Status.INTERNAL.withDescription("internal error in gpumemd; the server log has the cause");
      ask.failed(status.withDescription("session " + sessionId + "'s " + (wake ? "Wake" : "Sleep")
          + " was refused: " + status.getDescription()).asRuntimeException());
      throw e;
    }
  }

  static SleepResponse sleepResponse(SessionSleep.Slept slept) {
    return SleepResponse.newBuilder().addAllLeaseIds(slept.leaseIds()).addAllSegmentIds(slept.segmentIds())
        .setHostBytes(slept.hostBytes()).setFreedBytes(slept.freedBytes()).build();
  }

  static WakeResponse wakeResponse(List<SessionSleep.Woken> woken) {
    WakeResponse.Builder out = WakeResponse.newBuilder();
    woken.forEach(w -> out.addSegments(ProtoMapping.segmentWake(w)));
    return out.build();
  }

  /** {@link UnaryCalls#answer} on the blocking executor: for calls that copy memory or wait for it. */
  private <T> void answerBlocking(String rpc, StreamObserver<T> response, Supplier<T> body) {
    try {
      blockingExecutor.execute(() -> answer(rpc, response, body));
    } catch (RejectedExecutionException e) {
      response.onError(Status.UNAVAILABLE.withDescription("gpumemd is shutting down").asRuntimeException());
    }
  }

  // ------------------------------------------------------------------------------ sharing

  private static int unsigned(int value) {
    // uint32 fields past 2^31 arrive negative in Java; they mean "huge".
    return (int) Math.min(Integer.toUnsignedLong(value), Integer.MAX_VALUE);
  }

  @Override
  public void share(ShareRequest request, StreamObserver<ShareResponse> response) {
    answer("Share", response, () -> {
      SharedObjects.Share share = sharing.share(Callers.current(), request.getSessionId(),
          request.getLeaseId(), unsigned(request.getExpiresAfterSeconds()), request.getReadOnly(),
          unsigned(request.getMaxAttaches()));
      return ShareResponse.newBuilder().setToken(share.token()).setExpiresAfterSeconds(share.expiresAfterSeconds())
          .setShareId(share.id()).build();
    });
  }

  @Override
  public void revokeShare(RevokeShareRequest request, StreamObserver<RevokeShareResponse> response) {
    answer("RevokeShare", response, () -> RevokeShareResponse.newBuilder()
        .setBlockReturned(sharing.revoke(Callers.current(), request.getSessionId(), request.getToken()))
        .build());
  }

  @Override
  public void attach(AttachRequest request, StreamObserver<AttachResponse> response) {
    answer("Attach", response, () -> attached(sharing.attach(Callers.current(), request.getSessionId(),
        request.getToken(), request.getTag())));
  }

  @Override
  public void publish(PublishRequest request, StreamObserver<PublishResponse> response) {
    answer("Publish", response, () -> {
      sharing.publish(Callers.current(), request.getSessionId(), request.getLeaseId(), request.getName(),
          request.getReadOnly());
      return PublishResponse.getDefaultInstance();
    });
  }

  /** On the blocking executor: a parked object is restored first (a lease, maybe a wait, a copy). */
  @Override
  public void lookup(LookupRequest request, StreamObserver<AttachResponse> response) {
    Caller caller = Callers.current();
    answerBlocking("Lookup", response, () -> attached(sharing.lookup(caller, request.getSessionId(),
        request.getName(), request.getTag())));
  }

  @Override
  public void unpublish(UnpublishRequest request, StreamObserver<UnpublishResponse> response) {
    answer("Unpublish", response, () -> UnpublishResponse.newBuilder()
        .setBlockReturned(sharing.unpublish(Callers.current(), request.getSessionId(), request.getName()))
        .build());
  }

  private static AttachResponse attached(LeaseRecord hold) {
    return AttachResponse.newBuilder().setLease(ProtoMapping.leaseResponse(hold)).setReadOnly(hold.readOnly())
        .setHolds(hold.shared().holds()).build();
  }
}
