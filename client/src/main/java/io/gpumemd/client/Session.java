package io.gpumemd.client;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseReply;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.grpc.Status;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One session at the daemon and everything that belongs to it: its mappings (a restarted
 * daemon reuses segment ids), its client cache, its stream, its pending notices and the leases
 * it waits for. A lease remembers its session (through {@link #owner}): once that session is
 * lost, the lease is dead, and closing it touches nothing of a later session.
 *
 * <p>Locks, always taken in this order: the stream's ({@link SessionStream}), the client
 * cache's, the notices' ({@link Notices}). Nothing is sent while the cache's lock is held.
 *
 * <p>Thread-safe. Which session is current, and when a new one opens, is {@link SessionKeeper}'s.
 */
final class Session {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  final String id;
  final long generation;
  final int ttlSeconds;
  final long graceMillis;
  final MappingCache mappings;
  /** Null on the unary path or when the daemon grants no allowance. */
  final ClientCache cache;
  final SessionStream stream;
  final Notices notices;
  /** What this session's leases ask of it. */
  final Lease.Owner owner;
  final CountDownLatch firstAttach = new CountDownLatch(1);
  private final AtomicBoolean lost = new AtomicBoolean();
  private final Map<Long, CompletableFuture<LeaseResponse>> pendingLeases = new ConcurrentHashMap<>();
  private final ClientCounters counters;

  Session(OpenSessionResponse opened, long generation, boolean streamCalls, ScheduledExecutorService flusher,
      ClientCounters counters, Function<Session, Lease.Owner> owners, FdChannelClient fdChannel) {
    this.id = opened.getSessionId();
    this.generation = generation;
    this.ttlSeconds = opened.getTtlSeconds();
    this.graceMillis = opened.getKeepaliveGraceMs();
    this.counters = counters;
    this.stream = new SessionStream(lost::get);
    this.mappings = new MappingCache(segmentId ->
        stream.sendIfOpen(KeepAliveRequest.newBuilder().addUnmappedSegmentIds(segmentId).build()), fdChannel, id,
        deviceUuids(opened));
    this.cache = streamCalls && opened.getClientCacheBytes() > 0
        ? new ClientCache(opened.getClientCacheBytes(), maxOversizeBytes(opened)) : null;
    this.notices = new Notices(stream, cache, flusher);
    this.owner = owners.apply(this);
  }

  /** The daemon's devices by ordinal, with their uuids (empty from a daemon that predates them). */
  static Map<Integer, String> deviceUuids(OpenSessionResponse opened) {
    Map<Integer, String> uuids = new java.util.HashMap<>();
    opened.getDevicesList().forEach(d -> uuids.put(d.getDevice(), d.getUuid()));
    return uuids;
  }

  /** The daemon's oversize rule; the default from a daemon that predates the field. */
  static long maxOversizeBytes(OpenSessionResponse opened) {
    return opened.hasMaxOversizeBytes() ? opened.getMaxOversizeBytes() : SizeClasses.DEFAULT_MAX_OVERSIZE;
  }

  boolean isLost() {
    return lost.get();
  }

  /**
   * Marks the session lost, once: its cache is emptied, its stream ended, the leases it waits
   * for fail, its notices are dropped, and its mappings abandoned (segment ids of a restarted
   * daemon mean other segments).
   *
   * @return false when it was lost already
   */
  boolean lose() {
    if (!lost.compareAndSet(false, true)) {
      return false;
    }
    if (cache != null) {
      cache.drain(); // first: no lease is taken from it any more
    }
    firstAttach.countDown();
    stream.end(); // leases waiting for the stream open a new session instead
    failPending(Status.UNAVAILABLE.withDescription("session lost"));
    notices.discard();
    mappings.abandonAll();
    return true;
  }

  /** Registers a stream lease; its reply completes {@code reply}. */
  void expectReply(long requestId, CompletableFuture<LeaseResponse> reply) {
    pendingLeases.put(requestId, reply);
  }

  /** A stream lease that was never sent. */
  void forgetReply(long requestId) {
    pendingLeases.remove(requestId);
  }

  /** The daemon answered a stream lease. */
  void leaseReplied(LeaseReply reply) {
    CompletableFuture<LeaseResponse> waiting = pendingLeases.remove(reply.getRequestId());
    if (waiting == null) {
      log.warn("gpumemd answered lease request {}, which nobody waits for", reply.getRequestId());
      return;
    }
    if (reply.hasLease()) {
      counters.daemonLeases.incrementAndGet();
      waiting.complete(reply.getLease());
    } else {
      waiting.completeExceptionally(new GpuMemException(Status.fromCodeValue(reply.getError().getCode()).getCode(),
          reply.getError().getMessage(), null));
    }
  }

  /** Leases in flight on a broken stream get no reply: fail them so that callers may retry. */
  void failPending(Status status) {
    for (Long requestId : pendingLeases.keySet()) {
      CompletableFuture<LeaseResponse> waiting = pendingLeases.remove(requestId);
      if (waiting != null) {
        waiting.completeExceptionally(new GpuMemException(Status.Code.UNAVAILABLE,
            "the KeepAlive stream to gpumemd broke (" + status.getCode()
            + (status.getDescription() == null ? "" : ": " + status.getDescription()) + "); retry", null));
      }
    }
  }

  /** Releases a lease by a notice on the stream (not waited for), and lets go of its mapping. */
  void releaseByNotice(Lease lease) {
    counters.releases.incrementAndGet();
    notices.release(lease.id());
    mappings.release(lease);
    notices.afterRecord();
  }

  /** A lease the client cache evicted, its release notice already queued: counted and unmapped. */
  void releasedByEviction(Lease lease) {
    counters.releases.incrementAndGet();
    mappings.release(lease);
  }

  /** Releases a granted lease that was never handed to the caller (nothing of it is mapped). */
  void releaseUnwrapped(String leaseId) {
    counters.releases.incrementAndGet();
    notices.release(leaseId);
    notices.afterRecord();
  }

  /** Releases cached leases the daemon asked for (or the allowance no longer covers), at once. */
  void giveBack(List<Lease> leases) {
    for (Lease lease : leases) {
      releaseByNotice(lease);
    }
    notices.flush();
  }
}
