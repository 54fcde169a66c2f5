package io.gpumemd.server.grpc;

import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * One client's KeepAlive stream: it binds the session and keeps it alive, takes the client's
 * acknowledgements and cache-tier notices, and serves its leases and releases (the session's
 * fast path: one round trip per lease, releases not waited for).
 *
 * <p>Order within one message: unmap confirmations, cache notices (in the client's order),
 * releases, counters, then leases, so that memory given back in a message is there for the
 * leases it carries. A bad request gets its own error (LeaseReply.error, ReleaseFailed) with
 * the unary call's status; the stream carries on. Only a bad binding (unknown session, a second
 * session on one stream) ends the stream.
 *
 * <p>Flow control: inbound messages are requested one at a time, and not while {@value
 * #MAX_OUTSTANDING} leases await their replies, so a client that floods the stream is held by
 * HTTP/2 flow control and the replies the server buffers stay bounded.
 *
 * <p>Thread-safety: gRPC delivers inbound messages one at a time; replies come from transport
 * and backend threads through the {@link StreamSessionChannel}, which serializes them.
 */
final class SessionStream implements StreamObserver<KeepAliveRequest> {
  static final int MAX_OUTSTANDING = 256;

  private final SessionRegistry registry;
  private final AllocatorService leases;
  private final ServerCallStreamObserver<SessionEvent> call;
  /** Who opened the stream: every message on it acts for this caller. */
  private final Caller caller;
  private final StreamSessionChannel channel;
  private final AtomicInteger outstanding = new AtomicInteger();
  /** True while inbound reading is paused for too many outstanding leases. */
  private final AtomicBoolean paused = new AtomicBoolean();
  private Session session;

  SessionStream(SessionRegistry registry, AllocatorService leases, ServerCallStreamObserver<SessionEvent> call,
      Caller caller) {
    this.registry = registry;
    this.caller = caller;
    this.leases = leases;
    this.call = call;
    this.channel = new StreamSessionChannel(call);
    call.disableAutoRequest();
    call.request(1);
  }

  @Override
  public void onNext(KeepAliveRequest message) {
    try {
      bind(message);
    } catch (RuntimeException e) {
      if (session != null) {
        registry.detach(session, channel);
      }
      channel.fail(StatusMapper.toStatus("KeepAlive", e));
      return;
    }
    try {
      if (message.getUnmappedSegmentIdsCount() > 0) {
        registry.unmapped(session, message.getUnmappedSegmentIdsList());
      }
      applyCacheNotices(message.getCacheNoticesList());
    } catch (RuntimeException e) {
      // Not the client's fault (each notice's own refusals are answered above): logged once,
      // and the stream carries on with the rest of the message.
      StatusMapper.toStatus("KeepAlive", e);
    }
    for (StreamRelease release : message.getReleasesList()) {
      try {
        registry.release(caller, session.id(), release.getLeaseId(), release.getCudaIpcEventHandle().toByteArray());
      } catch (RuntimeException e) {
        channel.releaseFailed(release.getLeaseId(), StatusMapper.toStatus("Release", e).getStatus());
      }
    }
    for (ClientCacheCounters c : message.getClientCountersList()) {
      try {
        registry.clientCounters(session, c.getDevice(), c.getHits(), c.getReturns());
      } catch (InvalidRequestException e) {
        // Counters of a device this daemon does not have: nothing to add them to.
      }
    }
    for (StreamLease lease : message.getLeasesList()) {
      outstanding.incrementAndGet();
      long id = lease.getRequestId();
      leases.serveLease(caller, session.id(), lease.getDevice(), lease.getSizeBytes(), lease.getZero(), lease.getTag(),
          reply -> {
            channel.leaseReply(id, reply);
            replied();
          },
          refused -> {
            channel.leaseRefused(id, refused.getStatus());
            replied();
          });
    }
    requestMore();
  }

  private void bind(KeepAliveRequest message) {
    if (session == null) {
      session = registry.attach(caller, message.getSessionId(), channel);
      channel.attached(session.id());
    } else if (!message.getSessionId().isEmpty() && !message.getSessionId().equals(session.id())) {
      throw Status.INVALID_ARGUMENT
          .withDescription("session_id: a KeepAlive stream serves one session (expected: "
              + session.id() + " or empty)")
          .asRuntimeException();
    } else {
      registry.touch(session);
    }
  }

  /** Applies cache notices in order, batching runs of one kind into one registry call. */
  private void applyCacheNotices(List<CacheNotice> notices) {
    int i = 0;
    while (i < notices.size()) {
      boolean reused = notices.get(i).getReused();
      List<String> run = new ArrayList<>();
      while (i < notices.size() && notices.get(i).getReused() == reused) {
        run.add(notices.get(i).getLeaseId());
        i++;
      }
      List<String[]> refused = reused ? registry.reused(session, run) : registry.cached(session, run);
      for (String[] r : refused) {
        channel.releaseFailed(r[0], Status.NOT_FOUND.withDescription(r[1]));
      }
    }
  }

  private void replied() {
    if (outstanding.decrementAndGet() < MAX_OUTSTANDING && paused.compareAndSet(true, false)) {
      call.request(1);
    }
  }

  /** Asks for the next message unless too many leases await replies. */
  private void requestMore() {
    if (outstanding.get() < MAX_OUTSTANDING) {
      call.request(1);
    } else {
      paused.set(true);
      // A reply may have come in between the check and the flag: look again.
      if (outstanding.get() < MAX_OUTSTANDING && paused.compareAndSet(true, false)) {
        call.request(1);
      }
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
}
