package io.gpumemd.server.session;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.books.ClientCache;
import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Page;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.Reservation;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.books.SegmentHolding;
import io.gpumemd.server.books.Tenant;
import io.gpumemd.server.books.Validation;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.offload.HostStore;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.LeasedBlock;
import io.gpumemd.server.sharing.SharedObjects;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Owns sessions, and the way leases are made and returned for them: the daemon's domain facade
 * that the gRPC services call. Its rooms: {@link SessionDirectory} (finding a caller's session,
 * tenants, draining); in {@code books}, {@link LeaseBook} (every lease and hold, and returning
 * them), {@link Reservation} (quota taken once per lease, committed or given back) and {@link
 * ClientCache} (client cache notices and counters); in {@code sharing}, {@link SharedObjects}
 * (tokens and names), which the gRPC services call directly.
 *
 * <p>Rules enforced here: a session belongs to the tenant of the caller that opened it, and a
 * call naming another tenant's session or lease answers NOT_FOUND, exactly like an unknown id
 * (admins may list and end any session); a session ends by {@link #close}, by its KeepAlive
 * stream staying away past the grace period, or by TTL expiry without keep-alive, and then
 * every lease it held returns to its pool; quotas hold per session and per tenant; a draining
 * registry takes no new sessions or leases.
 *
 * <p>A lease is made in two steps when it needs the backend: {@link #beginLease} checks it and
 * reserves its quota on the transport thread, {@link #leaseCached} serves a pool hit there,
 * and on a miss {@link #leaseFromBackend} serves the same reservation on a thread that may block.
 *
 * <p>Snapshot and restore: {@link #snapshot} writes the whole session layer down ({@link
 * SessionsSnapshot}, {@link SessionsSnapshotWriter}) and {@link #restore} rebuilds a fresh
 * registry from one written in another process ({@link SessionsRestorer}); the caller takes the
 * snapshot with its request gate closed and its reaper stopped (a reap ending a session or a
 * token would return blocks the other process owns from then on).
 *
 * <p>Thread-safety: sessions and leases live in concurrent maps; a session's own transitions
 * (stream attach and detach, quota, ending) are atomic on the {@link Session}; who returns a
 * lease is decided in the {@link LeaseBook}. {@link #reap} runs on one housekeeping thread.
 */
public final class SessionRegistry {
  private static final Logger log = LoggerFactory.getLogger(SessionRegistry.class);

  private final DevicePools pools;
  private final SessionSettings settings;
  private final Ticker ticker;
  private final LiveSessions sessions;
  private final SessionDirectory directory;
  private final LeaseBook book;
  private final SessionChurn churn;
  private final SharedObjects sharing;
  private final ClientCache clientCache;
  private final SessionSleep sleep;

  /** @param sessions the live sessions, shared with the pools (which send unmap requests through it) */
  public SessionRegistry(DevicePools pools, MemoryBackend backend, SessionSettings settings, Ticker ticker,
      LiveSessions sessions) {
    this(pools, backend, settings, ticker, sessions, HostStore.defaultMaxBytes());
  }

  /** @param offloadMaxBytes the bound on the host store: sleeping and parked contents ({@code --offload-max-bytes}) */
  public SessionRegistry(DevicePools pools, MemoryBackend backend, SessionSettings settings, Ticker ticker,
      LiveSessions sessions, long offloadMaxBytes) {
    this.pools = pools;
    this.sessions = sessions;
    this.settings = settings;
    this.ticker = ticker;
    this.churn = new SessionChurn(log, ticker.nanos());
    this.directory = new SessionDirectory(sessions, ticker);
    this.book = new LeaseBook(pools, backend, ticker);
    HostStore store = new HostStore(backend, offloadMaxBytes);
    this.sharing = new SharedObjects(directory, book, pools, settings.sharing(), ticker, store);
    this.clientCache = new ClientCache(pools, book);
    this.sleep = new SessionSleep(this, book, store, new SleepAsks(directory));
  }

  /** Sleep and wake of sessions, an admin's too: the gRPC services call it directly. */
  public SessionSleep sleep() {
    return sleep;
  }

  /** Share tokens and published objects: the gRPC services take it once and call it directly. */
  public SharedObjects sharing() {
    return sharing;
  }

  public SessionSettings settings() {
    return settings;
  }

  /** The device pools, whose devices and oversize rule each client is told of at OpenSession. */
  public DevicePools pools() {
    return pools;
  }

  // ------------------------------------------------------------------------------ sessions

  /**
   * Opens a session; {@code ttlSeconds} 0 takes the default, larger ones are capped.
   *
   * @param cacheBytes the client cache allowance asked for: negative = the default, 0 = none,
   *     else at most that (never more than the default)
   */
  public Session open(Caller caller, String clientName, int ttlSeconds, long cacheBytes) {
    directory.checkNotDraining();
    Validation.label("client_name", clientName);
    int ttl = ttlSeconds <= 0 ? settings.defaultTtlSeconds() : Math.min(ttlSeconds, settings.maxTtlSeconds());
    long allowance = cacheBytes < 0 ? settings.clientCacheBytes() : Math.min(cacheBytes, settings.clientCacheBytes());
    Tenant tenant = directory.tenant(caller.tenant());
    directory.admit(caller, tenant, settings.limits(), churn);
    Session session;
    try {
      String id = SecureIds.next();
      SegmentOwner owner = SessionDirectory.segmentOwner(caller, id, settings.isolateSessions());
      session = new Session(id, caller, tenant, owner, clientName, ttl,
          settings.quotaFor(clientName), allowance, ticker.nanos());
    } catch (RuntimeException e) {
      tenant.removeSession();
      sessions.unreserve();
      throw e;
    }
    sessions.add(session);
    churn.opened();
    log.atDebug().addKeyValue("session", session.id()).addKeyValue("client", clientName)
        .addKeyValue("tenant", caller.tenant())
        .log("Session {} opened by '{}' ({}, ttl {} s)", session.id(), clientName, caller, ttl);
    return session;
  }

  /**
   * A live session of the caller's tenant by id; refreshes its TTL. Another tenant's session
   * answers exactly like one that never existed, so ids leak nothing.
   */
  public Session session(Caller caller, String sessionId) {
    return directory.session(caller, sessionId);
  }

  /**
   * Ends a session: the caller's own, or any tenant's when the caller is an admin (logged with
   * who asked).
   */
  public long[] close(Caller caller, String sessionId) {
    Session session = directory.ofTenantOrAdmin(caller, sessionId);
    if (caller.owns(session.tenant())) {
      return end(session, "closed by the client");
    }
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("admin", caller.principal())
        .log("Admin {} ends {} of tenant {}", caller, session, session.tenant());
    return end(session, "ended by admin " + caller.principal());
  }

  /**
   * Binds a KeepAlive stream to a session of the caller's tenant. A live stream of the session
   * is replaced (and closed) only when the new one comes from the same origin; otherwise the
   * new one is refused ({@link ConflictException}).
   */
  public Session attach(Caller caller, String sessionId, SessionChannel channel) {
    Session session = session(caller, sessionId);
    SessionChannel previous;
    try {
      previous = session.attach(channel, caller.origin());
    } catch (IllegalStateException e) {
      // Lost a race with the session ending: the stream must not outlive it.
      throw new NotFoundException("session " + sessionId + " has ended");
    }
    if (previous != null) {
      previous.close();
    }
    if (directory.draining()) {
      channel.shutdownNotice(0);
    }
    // Unmap requests sent while no stream was attached were lost: ask again.
    for (DevicePool pool : pools.all()) {
      for (long segmentId : pool.awaitingUnmapBy(session.id())) {
        channel.requestUnmap(pool.device().ordinal(), segmentId);
      }
    }
    return session;
  }

  /** A KeepAlive stream went away; the session ends after the grace period unless one returns. */
  public void detach(Session session, SessionChannel channel) {
    if (session.detach(channel, ticker.nanos()) && !session.ended()) {
      log.debug("{}: KeepAlive stream closed; ends in {} ms unless it reconnects", session, settings.graceMillis());
    }
  }

  /** Keep-alive traffic on the stream. */
  public void touch(Session session) {
    session.touch(ticker.nanos());
  }

  /** The client confirms it unmapped segments. */
  public void unmapped(Session session, Collection<Long> segmentIds) {
    for (long segmentId : segmentIds) {
      DevicePool pool = pools.ofSegment(segmentId);
      if (pool != null) {
        pool.unmapped(session.id(), segmentId);
      }
    }
  }

  /** Ends a session and returns everything it held. Returns {leases, bytes}; idempotent. */
  long[] end(Session session, String reason) {
    Session.Ending ending = session.end();
    if (ending == null) {
      return new long[] {0, 0};
    }
    sessions.remove(session);
    session.tenantUsage().removeSession();
    long[] returned = book.returnAll(ending.leases());
    long count = returned[0];
    long bytes = returned[1];
    long holds = returned[2];
    for (DevicePool pool : pools.all()) {
      pool.holderEnded(session.id());
    }
    if (ending.channel() != null) {
      ending.channel().close();
    }
    // A session that ends holding memory is news to an operator, an empty one routine; in a
    // flood, even the news is summed up by the churn summary beyond a few lines a minute.
    (churn.ended(count + holds, bytes) ? log.atInfo() : log.atDebug())
        .addKeyValue("session", session.id()).addKeyValue("client", session.clientName())
        .addKeyValue("released_leases", count).addKeyValue("released_bytes", bytes)
        .addKeyValue("released_holds", holds)
        .log("Session {} ('{}') ended: {}; released {} leases, {} bytes ({}){}", session.id(),
        session.clientName(), reason, count, bytes, Sizes.format(bytes),
        holds == 0 ? "" : ", and " + holds + " holds on shared blocks");
    return new long[] {count, bytes};
  }

  // ------------------------------------------------------------------------------ leases

  /**
   * Leases a block for a session of the caller's tenant, within the session's and the
   * tenant's quota, in one call: {@link #beginLease}, then {@link #leaseCached} or {@link
   * #leaseFromBackend}.
   *
   * @param cachedOnly when true, return null instead of doing anything that needs a backend call
   */
  public LeaseRecord lease(Caller caller, String sessionId, int device, long size, boolean zero, String tag,
      boolean cachedOnly) {
    try (PendingLease pending = beginLease(caller, sessionId, device, size, zero, tag)) {
      return cachedOnly ? leaseCached(pending) : leaseFromBackend(pending);
    }
  }

  /**
   * Starts a lease for a session of the caller's tenant: checks the request and reserves the
   * session's and the tenant's quota, once. Serve it with {@link #leaseCached} and, when that
   * needs the backend, {@link #leaseFromBackend}; close it in any case (a recorded lease keeps
   * its quota).
   *
   * @throws ExhaustedException at a quota, having reserved nothing
   */
  public PendingLease beginLease(Caller caller, String sessionId, int device, long size, boolean zero, String tag) {
    directory.checkNotDraining();
    Session session = session(caller, sessionId);
    DevicePool pool = pools.get(device);
    Validation.leaseSize(size, pool);
    Validation.label("tag", tag);
    Quota tenantQuota = settings.tenantQuota();
    // Released memory the tenant's processes may still map counts against its quota: without
    // it, leasing, mapping and ending the session in a loop pins memory outside every bound.
    long pinned = tenantQuota.maxLeasedBytes() > 0 ? pools.pinnedBytes(session.tenant()) : 0;
    Reservation quota = Reservation.forLease(session, SizeClasses.roundUp(size), tenantQuota, pinned);
    return new PendingLease(session, quota, pool, size, zero, tag);
  }

  /**
   * Serves a pending lease from the pool's cached blocks, on a thread that must not block.
   *
   * @return the lease, or null when it needs a backend call (a miss, or zeroing)
   */
  public LeaseRecord leaseCached(PendingLease pending) {
    if (pending.zero) {
      return null;
    }
    Session session = pending.session();
    LeasedBlock leased = pending.pool.tryLeaseCached(pending.size, session.id(), session.segmentOwner());
    return leased == null ? null : record(pending, leased);
  }

  /** Serves a pending lease, allocating from the backend on a miss; may block (a miss may wait for memory). */
  public LeaseRecord leaseFromBackend(PendingLease pending) {
    Session session = pending.session();
    return record(pending, pending.pool.lease(pending.size, pending.zero, session.id(), session.segmentOwner()));
  }

  private LeaseRecord record(PendingLease pending, LeasedBlock leased) {
    LeaseRecord lease = book.record(pending.quota, leased, pending.size, pending.tag);
    if (log.isDebugEnabled()) {
      Block block = lease.block();
      log.atDebug().addKeyValue("session", lease.session().id()).addKeyValue("lease", lease.id())
          .log("{}: lease {} of {} bytes on device {} (segment {}, offset {}, {}), tag '{}'", lease.session(),
          lease.id(), pending.size, block.device(), block.segmentId(), block.offset(),
          lease.poolHit() ? "hit" : "miss", pending.tag);
    }
    return lease;
  }

  /**
   * Releases a lease of a session of the caller's tenant; with a completion event the block is
   * reused once it fires.
   *
   * @throws NotFoundException for an unknown lease, another session's lease, or a repeat
   */
  public void release(Caller caller, String sessionId, String leaseId, byte[] eventHandle) {
    book.release(session(caller, sessionId), leaseId, eventHandle);
  }

  /**
   * What a session of the caller's tenant holds in a segment: the fd channel hands a segment's
   * descriptor only to a process of the session's tenant whose session holds a lease or hold
   * in it. Refreshes the session's TTL, like any call naming it.
   *
   * @throws NotFoundException for an unknown session or another tenant's (the same answer), or
   *     a segment the session holds nothing in
   */
  public SegmentHolding holding(Caller caller, String sessionId, long segmentId) {
    Session session = session(caller, sessionId);
    SegmentHolding holding = session.holding(segmentId);
    if (holding == null) {
      throw new NotFoundException("segment " + segmentId + ": " + session + " holds no lease or hold in it");
    }
    return holding;
  }

  /** The client cache tier's notices and counters of every session. */
  public ClientCache clientCache() {
    return clientCache;
  }

  /** The holdings of a tenant by key (created on first use). */
  public Tenant tenant(String key) {
    return directory.tenant(key);
  }

  // ------------------------------------------------------------------------------ housekeeping

  /**
   * Ends sessions whose stream stayed away past the grace period or whose TTL passed without
   * keep-alive, reports leases held past the leak threshold, and frees the host store's spare
   * buffers left unused. Called periodically.
   */
  public void reap() {
    long now = ticker.nanos();
    churn.flush(now, sessions.size());
    sharing.expire(now);
    long grace = TimeUnit.MILLISECONDS.toNanos(settings.graceMillis());
    for (Session session : sessions.all()) {
      String why = session.expiry(now, grace);
      if (why != null) {
        end(session, why);
      }
    }
    book.reportLeaks(now, TimeUnit.MILLISECONDS.toNanos(settings.leakThresholdMillis()));
    sleep.store().trimSpares();
  }

  /** Stops taking sessions and leases and tells every attached client. */
  public void beginDrain(long drainMillis) {
    directory.beginDraining();
    sessions.tellAttached("Shutdown", c -> c.shutdownNotice(drainMillis));
  }

  public boolean draining() {
    return directory.draining();
  }

  /**
   * Tells every attached client that its session moved to another daemon, and ends the
   * streams: the clients reattach there. Nothing ends: the sessions are the other daemon's
   * now.
   */
  public void moved() {
    sessions.tellAttached("Moving", SessionChannel::moving);
  }

  /**
   * Tells every attached client where the successor about to take its session over listens
   * ({@link SessionChannel#successorAt}), so that it connects there before the pause; an empty
   * name, that the successor went away (the clients drop their connection to it).
   *
   * @return the sessions told
   */
  public int successorAt(String socketName) {
    return sessions.tellAttached("Successor", c -> c.successorAt(socketName));
  }

  /** See {@link LiveSessions#awaitStreams}: a successor lets its clients reattach before it finishes starting. */
  public void awaitStreams(int expected, long maxMillis) {
    sessions.awaitStreams(expected, maxMillis);
  }

  /** Ends every session, then drops every share token and published name (shutdown). */
  public void endAll(String reason) {
    for (Session session : sessions.all()) {
      end(session, reason);
    }
    sharing.dropAll(reason);
  }

  // ------------------------------------------------------------------------ snapshot, restore

  /**
   * The session layer written down ({@link SessionsSnapshotWriter}), its ages counted back from
   * {@code nowNanos} ({@link #nanos}: an unchanged lease in two snapshots ages by the time between
   * them). Call it while no request is applied (the caller's gate is closed); it still reads each
   * object under its monitor.
   *
   * @throws IllegalStateException when the state cannot move now (a shared block waiting for a
   *     completion event), or the books disagree: the caller is to refuse
   */
  public SessionsSnapshot snapshot(long nowNanos) {
    return new SessionsSnapshotWriter(sessions, book, sharing, churn).take(nowNanos);
  }

  /** This registry's clock, which its snapshots count ages back from. */
  public long nanos() {
    return ticker.nanos();
  }

  /**
   * Rebuilds this fresh registry (serving nothing yet) from a snapshot written in another process,
   * over pools already restored ({@link SessionsRestorer}: this daemon's quotas, TTL bound and
   * client cache cap apply without shrinking what is leased; sessions come back detached).
   *
   * @return what was restored, for the caller's log lines
   * @throws IllegalStateException when this registry is not fresh, or the snapshot does not fit
   *     the pools or itself (the message names the lease); the caller discards the registry
   */
  public SessionsSnapshot.Restored restore(SessionsSnapshot snapshot) {
    return new SessionsRestorer(new RegistryRooms(pools, settings, ticker, sessions, directory, book, sharing, churn))
        .restore(snapshot);
  }

  // ------------------------------------------------------------------------------ listing

  public int liveLeases() {
    return book.size();
  }

  /** Live leases in grant order: every tenant's for an admin, else the caller's tenant's only. */
  public List<LeaseRecord> leases(Caller caller, Integer device, String sessionId) {
    return book.list(caller, device, sessionId);
  }

  /**
   * A page of live leases in grant order, after the lease with sequence number
   * {@code afterSequence} (0 for the first page): every tenant's for an admin, else the caller's
   * tenant's only.
   */
  public Page<LeaseRecord> leasePage(Caller caller, Integer device, String sessionId, long afterSequence, int size) {
    return book.page(caller, device, sessionId, afterSequence, size);
  }

  /** A page of live sessions by age: see {@link LiveSessions#page}. */
  public Page<Session> sessionPage(Caller caller, long afterNanos, String afterId, int size) {
    return sessions.page(caller, afterNanos, afterId, size);
  }

  public int sessionCount() {
    return sessions.size();
  }

  /** Live sessions by age: every tenant's for an admin, else the caller's tenant's only. */
  public List<Session> sessions(Caller caller) {
    return sessions.visibleTo(caller);
  }

  public long ageMillis(long sinceNanos) {
    return (ticker.nanos() - sinceNanos) / 1_000_000;
  }
}
