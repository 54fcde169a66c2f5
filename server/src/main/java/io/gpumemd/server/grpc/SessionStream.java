package io.gpumemd.server.grpc;

import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.books.ClientCache;
import io.gpumemd.server.books.NoticeRefusal;
import io.gpumemd.server.error.StatusMapper;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.takeover.HandOverGate;
import io.gpumemd.server.takeover.HandOverInterceptor;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One client's KeepAlive stream: it binds the session and keeps it alive, takes the client's
 * acknowledgements and cache-tier notices, and serves its leases and releases (the session's
 * fast path: one round trip per lease, releases not waited for).
 *
 * <p>Order within one message: unmap confirmations and counters; releases of leases the
 * message's cache notices do not name; the cache notices (in the client's order); the releases
 * of leases they name; then leases. So memory given back in a message is there for the leases
 * it carries, a client that evicts cached leases to make room for another stays within its
 * allowance, and a lease may be cached and released in one message. A bad request gets its own
 * error (LeaseReply.error, ReleaseFailed) with the unary call's status; the stream carries on.
 * A bad binding (unknown session, a second session on one stream) or a message of more than
 * {@value #MAX_ENTRIES} entries ends the stream.
 *
 * <p>Flow control, so that a client that floods the stream and never reads it slows only
 * itself: messages are requested one at a time, and the next one only when this one is
 * applied, fewer than {@value #MAX_OUTSTANDING} leases await their replies, and the transport
 * takes replies ({@code isReady()}: at most gRPC's 32 KiB threshold unsent). A message is
 * applied entry by entry and pauses at the first entry that finds the transport full, resuming
 * in {@code onReady}, so the replies one stream can make the daemon buffer stay near that
 * threshold whatever its messages hold. A stream that stays full is closed by the {@link
 * StreamWatchdog}.
 *
 * <p>Thread-safety: gRPC delivers inbound messages and {@code onReady} one at a time (the
 * message cursor is theirs alone); lease replies come from transport and backend threads
 * through the {@link StreamSessionChannel}, which serializes them. Whether to request the next
 * message is decided under this object's monitor.
 */
final class SessionStream implements StreamObserver<KeepAliveRequest> {
  private static final Logger log = LoggerFactory.getLogger(SessionStream.class);
  static final int MAX_OUTSTANDING = 256;
  /**
   * Most entries in one message, all repeated fields together: a client sends at most 4,096
   * notices and releases in a message, plus its lease and its counters.
   */
  static final int MAX_ENTRIES = 8192;
  /** Cache notices applied per registry call: readiness is checked between runs. */
  private static final int NOTICE_RUN = 64;

  private enum Phase { RELEASES_FIRST, NOTICES, RELEASES_LAST, LEASES, DONE }

  private final SessionRegistry registry;
  /** The client cache tier's notices and counters (Cached, Reused, ClientCounters messages). */
  private final ClientCache clientCache;
  private final AllocatorService leases;
  private final ServerCallStreamObserver<SessionEvent> call;
  /** Who opened the stream: every message on it acts for this caller. */
  private final Caller caller;
  private final StreamSessionChannel channel;
  private final AtomicInteger outstanding = new AtomicInteger();
  /** Bound by the first message; read by the watchdog thread too. */
  private volatile Session session;

  // The message being applied and where it stopped; gRPC's callback thread only.
  private KeepAliveRequest current;
  private Phase phase = Phase.DONE;
  private int index;
  /** Lease ids the current message's cache notices name; null when it has no releases. */
  private Set<String> noticed;

  /** Each message is applied inside it, and each lease it starts until answered (take-over). */
  private final HandOverGate gate;

  // Guarded by this.
  /** The current message holds a place in the gate. */
  private boolean inGate;
  private boolean applying;
  private boolean requested;
  private boolean ended;

  SessionStream(SessionRegistry registry, AllocatorService leases, ServerCallStreamObserver<SessionEvent> call,
      Caller caller, StreamWatchdog watchdog, HandOverGate gate) {
    this.gate = gate;
    this.registry = registry;
    this.clientCache = registry.clientCache();
    this.caller = caller;
    this.leases = leases;
    this.call = call;
    this.channel = new StreamSessionChannel(call, watchdog, this::stalled);
    call.disableAutoRequest();
    call.setOnReadyHandler(this::onReady);
    requested = true;
    call.request(1);
  }

  @Override
  public void onNext(KeepAliveRequest message) {
    if (!gate.enter()) {
      // The daemon hands over: not applied, not counted; the client sends it again to the
      // successor, as soon as the hand-over ends when the gate holds it.
      if (!gate.hold(this::handOverEnded)) {
        endMoving();
      }
      return;
    }
    synchronized (this) {
      inGate = true;
      requested = false;
      applying = true;
    }
    try {
      checkSize(message);
      bind(message);
    } catch (RuntimeException e) {
      leaveGate();
      end(StatusMapper.toStatus("KeepAlive", e));
      return;
    }
    try {
      if (message.hasSleepHandler()) {
        session.sleepHandler(message.getSleepHandler());
      }
      if (message.getUnmappedSegmentIdsCount() > 0) {
        registry.unmapped(session, message.getUnmappedSegmentIdsList());
      }
      for (ClientCacheCounters c : message.getClientCountersList()) {
        try {
          clientCache.clientCounters(session, c.getDevice(), c.getHits(), c.getReturns());
        } catch (InvalidRequestException e) {
          // Counters of a device this daemon does not have: nothing to add them to.
        }
      }
    } catch (RuntimeException e) {
      // Not the client's fault: logged once, and the stream carries on with the message.
      StatusMapper.toStatus("KeepAlive", e);
    }
    current = message;
    phase = Phase.RELEASES_FIRST;
    index = 0;
    noticed = noticedLeases(message);
    applyMore();
  }

  private static void checkSize(KeepAliveRequest m) {
    int entries = m.getUnmappedSegmentIdsCount() + m.getLeasesCount() + m.getReleasesCount()
        + m.getCacheNoticesCount() + m.getClientCountersCount();
    if (entries > MAX_ENTRIES) {
      throw new InvalidRequestException("KeepAlive: a message of " + entries + " entries (expected: at most "
          + MAX_ENTRIES + " leases, releases, cache notices, unmapped segment ids and counters together)");
    }
  }

  private void bind(KeepAliveRequest message) {
    if (session == null) {
      session = registry.attach(caller, message.getSessionId(), channel);
      // Read before this first message is applied: the client sends again what came after.
      channel.attached(session.id(), session.appliedMessages());
    } else if (!message.getSessionId().isEmpty() && !message.getSessionId().equals(session.id())) {
      throw Status.INVALID_ARGUMENT
          .withDescription("session_id: a KeepAlive stream serves one session (expected: "
              + session.id() + " or empty)")
          .asRuntimeException();
    } else {
      registry.touch(session);
    }
  }

  private static Set<String> noticedLeases(KeepAliveRequest m) {
    if (m.getReleasesCount() == 0 || m.getCacheNoticesCount() == 0) {
      return null;
    }
    Set<String> ids = new HashSet<>();
    for (CacheNotice notice : m.getCacheNoticesList()) {
      ids.add(notice.getLeaseId());
    }
    return ids;
  }

  /**
   * Applies the current message from where it stopped, until it is done or the transport
   * holds too many unsent replies (then {@link #onReady} resumes it).
   */
  private void applyMore() {
    KeepAliveRequest m = current;
    while (phase != Phase.DONE) {
      if (!call.isReady()) {
        return;
      }
      switch (phase) {
        case RELEASES_FIRST, RELEASES_LAST -> {
          if (index == m.getReleasesCount()) {
            next();
          } else {
            StreamRelease release = m.getReleases(index++);
            boolean named = noticed != null && noticed.contains(release.getLeaseId());
            if (named == (phase == Phase.RELEASES_LAST)) {
              release(release);
            }
          }
        }
        case NOTICES -> {
          if (index == m.getCacheNoticesCount()) {
            next();
          } else {
            index = applyNoticeRun(m.getCacheNoticesList(), index);
          }
        }
        case LEASES -> {
          if (index == m.getLeasesCount()) {
            next();
          } else {
            lease(m.getLeases(index++));
          }
        }
        case DONE -> throw new AssertionError();
      }
    }
    current = null;
    noticed = null;
    // Counted once every entry is applied (lease replies may still come): a reattaching
    // client sends again only messages past this count (StreamAttached.applied_messages).
    session.messageApplied();
    synchronized (this) {
      applying = false;
    }
    leaveGate();
    requestNext();
  }

  /** The current message is done (or will never be): its place in the gate is free. Once. */
  private void leaveGate() {
    synchronized (this) {
      if (!inGate) {
        return;
      }
      inGate = false;
    }
    gate.exit();
  }

  private void next() {
    phase = Phase.values()[phase.ordinal() + 1];
    index = 0;
  }

  private void release(StreamRelease release) {
    try {
      registry.release(caller, session.id(), release.getLeaseId(), release.getCudaIpcEventHandle().toByteArray());
    } catch (RuntimeException e) {
      channel.releaseFailed(release.getLeaseId(), StatusMapper.toStatus("Release", e).getStatus());
    }
  }

  /**
   * Applies notices from {@code from}: a run of one kind, at most {@value #NOTICE_RUN}, in one
   * registry call; answers each refusal. Returns where the next run starts.
   */
  private int applyNoticeRun(List<CacheNotice> notices, int from) {
    boolean reused = notices.get(from).getReused();
    int to = from;
    while (to < notices.size() && to - from < NOTICE_RUN && notices.get(to).getReused() == reused) {
      to++;
    }
    List<String> run = notices.subList(from, to).stream().map(CacheNotice::getLeaseId).toList();
    try {
      List<NoticeRefusal> refused = reused ? clientCache.reused(session, run) : clientCache.cached(session, run);
      for (NoticeRefusal r : refused) {
        channel.releaseFailed(r.leaseId(), StatusMapper.toStatus("KeepAlive", r.reason()).getStatus());
      }
    } catch (RuntimeException e) {
      StatusMapper.toStatus("KeepAlive", e); // not the client's fault: logged once
    }
    return to;
  }

  private void lease(StreamLease lease) {
    outstanding.incrementAndGet();
    gate.join(); // left in replied(): a hand-over waits for the answer
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

  private void replied() {
    gate.exit();
    outstanding.decrementAndGet();
    requestNext();
  }

  /** The transport takes replies again: resume the message, or ask for the next one. */
  private void onReady() {
    channel.ready();
    if (current != null) {
      applyMore();
    } else {
      requestNext();
    }
  }

  /**
   * Asks for the next message when the current one is applied, the transport takes replies and
   * fewer than {@value #MAX_OUTSTANDING} leases await replies; otherwise whichever of
   * {@link #applyMore}, {@link #onReady} or a lease reply ends the wait asks. Any thread.
   */
  private void requestNext() {
    synchronized (this) {
      if (requested || applying || ended || outstanding.get() >= MAX_OUTSTANDING || !call.isReady()) {
        return;
      }
      requested = true;
    }
    call.request(1);
  }

  /** The client has not read its replies for the stall timeout: close the stream (watchdog thread). */
  private void stalled() {
    long millis = channel.stallMillis();
    if (session != null) {
      log.atInfo().addKeyValue("session", session.id())
          .log("{}: KeepAlive stream closed: its client read none of its replies for {} ms "
              + "(--stream-stall-timeout-ms)", session, millis);
    }
    end(Status.RESOURCE_EXHAUSTED.withDescription("KeepAlive: the client read none of its replies for " + millis
        + " ms (--stream-stall-timeout-ms); the stream is closed").asRuntimeException());
  }

  /**
   * The hand-over that held this stream's message ended: the client is told that its session
   * moved (a MovingNotice, then the end: it reattaches at once, to the successor), or, when the
   * gate opened again, "moving" (it sends the message again, here). Either way unapplied.
   */
  private void handOverEnded(boolean moved) {
    synchronized (this) {
      if (ended) {
        return;
      }
    }
    if (moved) {
      over();
      channel.moving();
    } else {
      endMoving();
    }
  }

  private void endMoving() {
    end(HandOverInterceptor.movingStatus().asRuntimeException(HandOverInterceptor.movingTrailers()));
  }

  /** Ends the stream with an error; the session, if bound, waits out its grace period. */
  private void end(Throwable status) {
    over();
    channel.fail(status);
  }

  @Override
  public void onError(Throwable t) {
    over();
    channel.close();
  }

  @Override
  public void onCompleted() {
    over();
    channel.close();
  }

  /** The stream is over, whoever ended it: no more requests, the session (if bound) detached. */
  private void over() {
    synchronized (this) {
      ended = true;
    }
    leaveGate();
    if (session != null) {
      registry.detach(session, channel);
    }
  }
}
