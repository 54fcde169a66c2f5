package io.gpumemd.client;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.AttachResponse;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.PublishRequest;
import io.gpumemd.proto.v1.RevokeShareRequest;
import io.gpumemd.proto.v1.ShareRequest;
import io.gpumemd.proto.v1.ShareResponse;
import io.gpumemd.proto.v1.UnpublishRequest;
import io.grpc.Channel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * The sharing calls: share tokens (Share, RevokeShare, Attach) and published names (Publish,
 * Lookup, Unpublish). All are unary (they are rare, and make no backend call); a hold taken
 * by Attach or Lookup is mapped and handed out by {@link LeasePaths#wrap}. Closing a
 * {@link Share} or {@link Published} ends it "quietly": not once the client is closing (tokens
 * and names outlive the client by design), and a token or name already gone is no error.
 *
 * <p>Thread-safe: it keeps no state of its own.
 */
final class SharingCalls implements Share.Revoker, Published.Unpublisher {
  /** Deadline of the sharing calls. */
  private static final long SHARING_DEADLINE_MS = 10_000;
  /**
   * How long Share and Publish of a lease served from the client cache retry while the daemon
   * still has it as cached: the notice that it is in use again travels on the stream, which is
   * not ordered with the unary call.
   */
  private static final long REUSE_NOTICE_WAIT_MS = 2_000;

  private final SessionKeeper sessions;
  private final LeasePaths leases;
  private final AllocatorGrpc.AllocatorBlockingStub blocking;
  private final boolean streamCalls;
  private final Ticker ticker;
  private final Sleeper sleeper;

  SharingCalls(SessionKeeper sessions, LeasePaths leases, Channel channel, boolean streamCalls, Ticker ticker,
      Sleeper sleeper) {
    this.sessions = sessions;
    this.leases = leases;
    this.blocking = AllocatorGrpc.newBlockingStub(channel);
    this.streamCalls = streamCalls;
    this.ticker = ticker;
    this.sleeper = sleeper;
  }

  private AllocatorGrpc.AllocatorBlockingStub stub() {
    return blocking.withDeadlineAfter(SHARING_DEADLINE_MS, TimeUnit.MILLISECONDS);
  }

  /** Lease#share: the token for a lease or hold of session {@code s}. */
  Share share(Session s, Lease lease, ShareOptions options) {
    lease.markShared(); // before the call: a close meanwhile must not cache it
    ShareRequest request = ShareRequest.newBuilder().setSessionId(s.id).setLeaseId(lease.id())
        .setExpiresAfterSeconds((int) options.expiresAfter().getSeconds()).setReadOnly(options.readOnly())
        .setMaxAttaches(options.maxAttaches()).build();
    ShareResponse response = afterReuseNotice(s, lease, () -> stub().share(request));
    return new Share(this, response.getToken(), response.getExpiresAfterSeconds(), options);
  }

  /** GpuMemClient#publish of a lease of session {@code s}. */
  Published publish(Session s, Lease lease, String name, boolean readOnly) {
    if (lease.isClosed()) {
      throw new IllegalStateException("lease " + lease.id() + " is closed");
    }
    if (lease.isLost()) {
      throw new IllegalStateException("lease " + lease.id() + ": session lost: the daemon restarted or ended the session");
    }
    lease.markShared();
    PublishRequest request = PublishRequest.newBuilder().setSessionId(s.id).setLeaseId(lease.id()).setName(name)
        .setReadOnly(readOnly).build();
    afterReuseNotice(s, lease, () -> stub().publish(request));
    return new Published(this, name, readOnly);
  }

  /**
   * Runs Share or Publish of a lease; one served from the client cache first has its reuse
   * notice sent, and is retried while the daemon still answers FAILED_PRECONDITION (it has not
   * read the notice yet), for up to {@link #REUSE_NOTICE_WAIT_MS}.
   */
  private <T> T afterReuseNotice(Session s, Lease lease, Supplier<T> call) {
    if (lease.localHit() && streamCalls) {
      s.notices.flush();
    }
    long deadline = ticker.nanos() + TimeUnit.MILLISECONDS.toNanos(REUSE_NOTICE_WAIT_MS);
    long backoffMs = 1;
    while (true) {
      try {
        return call.get();
      } catch (StatusRuntimeException e) {
        GpuMemException error = sessions.failed(s, e);
        if (!(lease.localHit() && error.code() == Status.Code.FAILED_PRECONDITION) || ticker.nanos() > deadline) {
          throw error;
        }
      }
      s.notices.flush();
      try {
        sleeper.sleep(TimeUnit.MILLISECONDS.toNanos(backoffMs));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new GpuMemException(Status.Code.CANCELLED, "interrupted while sharing lease " + lease.id(), e);
      }
      backoffMs = Math.min(50, backoffMs * 2);
    }
  }

  /** One call for the current session (a new one when it was lost). */
  private <T> T call(Function<Session, T> call) {
    Session s = sessions.live();
    try {
      return call.apply(s);
    } catch (StatusRuntimeException e) {
      throw sessions.failed(s, e);
    }
  }

  /** Share#revoke. */
  @Override
  public boolean revoke(String token) {
    return call(s -> stub().revokeShare(RevokeShareRequest.newBuilder().setSessionId(s.id).setToken(token).build())
        .getBlockReturned());
  }

  /** Share#close. */
  @Override
  public void revokeQuietly(String token) {
    quietly(() -> revoke(token));
  }

  /** GpuMemClient#unpublish. */
  boolean unpublish(String name) {
    return call(s -> stub().unpublish(UnpublishRequest.newBuilder().setSessionId(s.id).setName(name).build())
        .getBlockReturned());
  }

  /** Published#close. */
  @Override
  public void unpublishQuietly(String name) {
    quietly(() -> unpublish(name));
  }

  /** Ends a token or name, unless the client is closing or it is gone already (NOT_FOUND). */
  private void quietly(Runnable end) {
    if (sessions.isClosing()) {
      return; // tokens and names outlive the client by design; end them before closing the client
    }
    try {
      end.run();
    } catch (GpuMemException e) {
      if (e.code() != Status.Code.NOT_FOUND) {
        throw e;
      }
    }
  }

  /** GpuMemClient#attach: a hold on the block a token names. */
  Lease attach(String token, String tag) {
    return hold(s -> stub().attach(AttachRequest.newBuilder().setSessionId(s.id).setToken(token).setTag(tag).build()),
        tag);
  }

  /** GpuMemClient#lookup: a hold on the block published under a name. */
  Lease lookup(String name, String tag) {
    return hold(s -> stub().lookup(LookupRequest.newBuilder().setSessionId(s.id).setName(name).setTag(tag).build()),
        tag);
  }

  /** Takes a hold for the current session and maps it. */
  private Lease hold(Function<Session, AttachResponse> attach, String tag) {
    return call(s -> {
      AttachResponse response = attach.apply(s);
      return leases.wrap(s, response.getLease(), -1, 0, tag, true, response.getReadOnly());
    });
  }
}
