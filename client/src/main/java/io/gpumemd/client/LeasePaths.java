package io.gpumemd.client;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.ReleaseResponse;
import io.gpumemd.proto.v1.StreamLease;
import io.grpc.Channel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The three ways a lease is served and given back, each sync and async:
 *
 * <ol>
 *   <li><b>local</b>: from the session's client cache ({@link ClientCache}), no round trip; a
 *       closed lease goes back into it within the allowance;
 *   <li><b>stream</b>: a {@code StreamLease} on the session's KeepAlive stream, answered by a
 *       {@code LeaseReply}; a release is a notice nobody waits for ({@link Notices});
 *   <li><b>unary</b>: the Lease and Release calls ({@code unaryCalls(true)}, or no stream).
 * </ol>
 *
 * <p>A stream-ordered release ({@link CudaLeases#closeAfter}) waits in {@link PendingReleases}
 * for its event, recorded in this process, and is then given back as any close is; the daemon
 * is never sent an event handle. A shared or published lease, or a hold, is never cached:
 * others still use the block. A lease of a lost session is gone with it: closing it does
 * nothing.
 *
 * <p>Thread-safe: any thread may lease and close concurrently; the state is the sessions'.
 */
final class LeasePaths {
  private final SessionKeeper sessions;
  private final AllocatorGrpc.AllocatorBlockingStub blocking;
  private final AllocatorGrpc.AllocatorStub async;
  private final boolean streamCalls;
  private final ClientCounters counters;
  private final PendingReleases pending;
  private final AtomicLong nextRequestId = new AtomicLong(1);

  /** @param streamCalls lease on the session's stream (with a client cache), not with unary calls */
  LeasePaths(SessionKeeper sessions, Channel channel, boolean streamCalls, ClientCounters counters,
      PendingReleases pending) {
    this.sessions = sessions;
    this.blocking = AllocatorGrpc.newBlockingStub(channel);
    this.async = AllocatorGrpc.newStub(channel);
    this.streamCalls = streamCalls;
    this.counters = counters;
    this.pending = pending;
  }

  /** GpuMemClient#lease: local, else on the stream, else unary. */
  Lease lease(int device, long sizeBytes, boolean zero, String tag) {
    Session current = sessions.live();
    Lease local = leaseLocally(current, device, sizeBytes, zero, tag);
    if (local != null) {
      return local;
    }
    if (streamCalls) {
      Session s = sessions.awaitStream(current);
      CompletableFuture<LeaseResponse> reply = leaseOnStream(s, device, sizeBytes, zero, tag);
      try {
        return wrap(s, reply.get(), device, sizeBytes, tag, false, false);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        // Nobody will take the lease if the daemon grants it after all: give it straight back.
        reply.thenAccept(granted -> s.releaseUnwrapped(granted.getLeaseId()));
        throw new GpuMemException(Status.Code.CANCELLED, "interrupted while waiting for a lease", e);
      } catch (ExecutionException e) {
        throw GpuMemException.from(e.getCause());
      }
    }
    LeaseResponse response;
    try {
      response = blocking.lease(request(current, device, sizeBytes, zero, tag));
    } catch (StatusRuntimeException e) {
      throw sessions.failed(current, e);
    }
    counters.daemonLeases.incrementAndGet();
    return wrap(current, response, device, sizeBytes, tag, false, false);
  }

  /** GpuMemClient#leaseAsync: as {@link #lease}, the wait for the daemon in the future. */
  CompletableFuture<Lease> leaseAsync(int device, long sizeBytes, boolean zero, String tag) {
    Session s;
    Lease local;
    try {
      s = sessions.live();
      local = leaseLocally(s, device, sizeBytes, zero, tag);
    } catch (RuntimeException e) {
      return CompletableFuture.failedFuture(e);
    }
    if (local != null) {
      return CompletableFuture.completedFuture(local);
    }
    if (streamCalls) {
      return leaseOnStream(s, device, sizeBytes, zero, tag)
          .thenApply(response -> wrapAsync(s, response, device, sizeBytes, tag));
    }
    CompletableFuture<Lease> result = new CompletableFuture<>();
    async.lease(request(s, device, sizeBytes, zero, tag), new StreamObserver<>() {
      @Override
      public void onNext(LeaseResponse response) {
        try {
          counters.daemonLeases.incrementAndGet();
          result.complete(wrapAsync(s, response, device, sizeBytes, tag));
        } catch (RuntimeException e) {
          result.completeExceptionally(e);
        }
      }

      @Override
      public void onError(Throwable t) {
        result.completeExceptionally(sessions.failed(s, t));
      }

      @Override
      public void onCompleted() {}
    });
    return result;
  }

  /** A lease from the session's own cache, zeroed when asked, or null. */
  private Lease leaseLocally(Session s, int device, long sizeBytes, boolean zero, String tag) {
    ClientCache cache = s.cache;
    if (cache == null || sessions.isClosing() || sizeBytes <= 0 || s.isLost()) {
      return null;
    }
    Lease cached = cache.take(device, sizeBytes, s.notices); // the take and its notice are one step
    if (cached == null) {
      return null;
    }
    s.notices.afterRecord(); // may send: outside the cache's lock (sending reads the counters)
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
    s.expectReply(id, reply);
    KeepAliveRequest.Builder message = KeepAliveRequest.newBuilder().addLeases(StreamLease.newBuilder()
        .setRequestId(id).setDevice(device).setSizeBytes(sizeBytes).setZero(zero).setTag(tag));
    if (!s.notices.send(message)) {
      s.forgetReply(id);
      reply.completeExceptionally(new GpuMemException(Status.Code.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
          + (s.isLost() ? " and the session is lost (the next lease opens a new one)" : "; retry"), null));
    }
    return reply;
  }

  private static LeaseRequest request(Session s, int device, long sizeBytes, boolean zero, String tag) {
    return LeaseRequest.newBuilder().setSessionId(s.id).setDevice(device)
        .setSizeBytes(sizeBytes).setZero(zero).setTag(tag).build();
  }

  /**
   * Maps a granted lease, or with {@code hold} a hold on a shared block (read-only when the
   * hold is), and hands it out; one that cannot be mapped is released at once, so that it is
   * not held until the session ends. The reply is checked first ({@link ReplyCheck}): one whose
   * block does not lie inside its segment, or is smaller than asked, is released unmapped and
   * fails INTERNAL, so that no buffer or pointer past the block is ever handed out.
   *
   * @param deviceAsked the device a lease asked for (ignored for a hold)
   * @param sizeAsked the bytes a lease asked for (ignored for a hold, which asks for no size)
   */
  Lease wrap(Session s, LeaseResponse granted, int deviceAsked, long sizeAsked, String tag, boolean hold,
      boolean readOnly) {
    return wrap(s, granted, deviceAsked, sizeAsked, tag, hold, readOnly, true);
  }

  /**
   * As {@link #wrap} for leaseAsync, which runs it on a transport thread (the channel's direct
   * executor): a lease it cannot hand out is given back without waiting, since a blocking call
   * there would wait for a reply that same thread has to read.
   */
  private Lease wrapAsync(Session s, LeaseResponse granted, int deviceAsked, long sizeAsked, String tag) {
    return wrap(s, granted, deviceAsked, sizeAsked, tag, false, false, false);
  }

  private Lease wrap(Session s, LeaseResponse granted, int deviceAsked, long sizeAsked, String tag, boolean hold,
      boolean readOnly, boolean mayBlock) {
    String what = hold ? "hold" : "lease";
    MappingCache.Acquired mapped;
    try {
      ReplyCheck.lease(granted, deviceAsked, hold ? 0 : sizeAsked);
      if (s.isLost()) {
        throw new GpuMemException(Status.Code.UNAVAILABLE, "session lost while the " + what + " was granted; retry", null);
      }
      mapped = s.mappings.acquire(granted.getDevice(), granted.getHandle(), readOnly, tag);
    } catch (RuntimeException | LinkageError e) {
      if (mayBlock) {
        releaseQuietly(s, granted.getLeaseId());
      } else {
        releaseWithoutWaiting(s, granted.getLeaseId());
      }
      if (e instanceof LinkageError) {
        throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "a CUDA " + what + " needs JCuda and its "
            + "natives on the classpath (org.jcuda:jcuda): " + e, e);
      }
      throw e;
    }
    return new Lease(s.owner, granted, mapped.segment(), mapped.mapping(), tag, hold, readOnly);
  }

  /** Gives back a lease that is not handed out; done when this returns (tests rely on it). */
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
   * Gives back a lease that is not handed out, without waiting (on a transport thread): on the
   * stream a release notice; else a Release call whose answer nobody waits for (on failure the
   * session's end takes the lease back).
   */
  private void releaseWithoutWaiting(Session s, String leaseId) {
    if (s.isLost()) {
      return;
    }
    if (streamCalls) {
      s.releaseUnwrapped(leaseId);
      return;
    }
    async.release(ReleaseRequest.newBuilder().setSessionId(s.id).setLeaseId(leaseId).build(), new StreamObserver<>() {
      @Override
      public void onNext(ReleaseResponse value) {}

      @Override
      public void onError(Throwable t) {}

      @Override
      public void onCompleted() {}
    });
  }

  /** Lease#close of a lease of {@code s}: into the client cache, or released (a notice, or a call). */
  void giveBack(Session s, Lease lease) {
    if (s.isLost()) {
      return;
    }
    if (!streamCalls) {
      release(s, lease);
      return;
    }
    ClientCache cache = lease.uncacheable() ? null : s.cache;
    if (cache != null && !sessions.isClosing()) {
      List<Lease> evicted = cache.offer(lease, s.notices); // the offer and its notice are one step
      if (evicted != null) {
        s.notices.afterRecord();
        for (Lease old : evicted) {
          s.releasedByEviction(old); // its release notice went in before the offer's
        }
        return;
      }
      if (s.isLost()) {
        return; // the cache was drained meanwhile: the session took the lease with it
      }
    }
    s.releaseByNotice(lease);
  }

  /**
   * Lease#closeWhen of a lease of {@code s}: given back once {@code done} completes, on the
   * releases thread. When the client is closing, nothing waits any more: {@code done} is
   * destroyed and CloseSession takes the lease back.
   */
  void giveBackWhen(Session s, Lease lease, PendingReleases.Completion done) {
    if (!pending.add(lease, done, closed -> giveBack(s, closed))) {
      done.destroy();
    }
  }

  /** Lease#closeAsync of a lease of {@code s}. */
  CompletableFuture<Void> giveBackAsync(Session s, Lease lease) {
    if (s.isLost()) {
      return CompletableFuture.completedFuture(null);
    }
    if (!streamCalls) {
      return releaseAsync(s, lease);
    }
    giveBack(s, lease);
    return CompletableFuture.completedFuture(null);
  }

  private void release(Session s, Lease lease) {
    counters.releases.incrementAndGet();
    try {
      blocking.release(releaseRequest(s, lease));
    } catch (StatusRuntimeException e) {
      GpuMemException error = GpuMemException.from(e);
      // After the client or session is gone the daemon already took the lease back.
      if (!(sessions.isClosing() || s.isLost()) || error.code() != Status.Code.NOT_FOUND) {
        throw error;
      }
    } finally {
      s.mappings.release(lease);
    }
  }

  private CompletableFuture<Void> releaseAsync(Session s, Lease lease) {
    counters.releases.incrementAndGet();
    CompletableFuture<Void> result = new CompletableFuture<>();
    async.release(releaseRequest(s, lease), new StreamObserver<>() {
      @Override
      public void onNext(ReleaseResponse value) {}

      @Override
      public void onError(Throwable t) {
        s.mappings.release(lease);
        result.completeExceptionally(GpuMemException.from(t));
      }

      @Override
      public void onCompleted() {
        s.mappings.release(lease);
        result.complete(null);
      }
    });
    return result;
  }

  private static ReleaseRequest releaseRequest(Session s, Lease lease) {
    return ReleaseRequest.newBuilder().setSessionId(s.id).setLeaseId(lease.id()).build();
  }
}
