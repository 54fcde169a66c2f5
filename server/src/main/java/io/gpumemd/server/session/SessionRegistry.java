package io.gpumemd.server.session;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.DrainingException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.LeasedBlock;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Owns sessions and leases: who holds what, and getting it all back when a holder goes away.
 *
 * <p>Rules enforced here: a session belongs to the tenant of the caller that opened it, and a
 * call naming another tenant's session or lease answers NOT_FOUND, exactly like an unknown id
 * (admins may list and end any session); only the owning session releases a lease (a foreign, unknown or
 * repeated release is {@link NotFoundException} and changes nothing); a session ends by
 * {@link #close}, by its KeepAlive stream staying away past the grace period, or by TTL expiry
 * without keep-alive, and then every lease it held returns to its pool; quotas hold per
 * session and per tenant; a draining registry takes no new sessions or leases.
 *
 * <p>Unknown and expired sessions both answer {@link NotFoundException} (NOT_FOUND): an ended
 * session's id is indistinguishable from one that never existed.
 *
 * <p>Thread-safety: sessions and leases live in concurrent maps. Who releases a lease is
 * decided by an atomic {@code remove(id, record)} on the lease map, so an explicit release and
 * a session ending concurrently release a block exactly once. A session's own transitions
 * (stream attach and detach, quota, ending) are atomic on the {@link Session}. {@link #reap}
 * runs on one housekeeping thread.
 */
public final class SessionRegistry {
  private static final Logger log = LoggerFactory.getLogger(SessionRegistry.class);

  private final DevicePools pools;
  private final MemoryBackend backend;
  private final SessionSettings settings;
  private final Ticker ticker;
  private final LiveSessions sessions;
  private final ConcurrentHashMap<String, LeaseRecord> leases = new ConcurrentHashMap<>();
  /** Holdings by tenant key; one entry per tenant ever seen (uids, token tenants: bounded by who can connect). */
  private final ConcurrentHashMap<String, Tenant> tenants = new ConcurrentHashMap<>();
  private final AtomicLong leaseSequence = new AtomicLong();
  private final SessionChurn churn;
  private final SharedObjects sharing;
  private volatile boolean draining;
  /** Written by the reaper thread only. */
  private long lastLeakScanNanos = Long.MIN_VALUE / 2;

  /**
   * @param sessions the live sessions, shared with the pools (which send unmap requests
   *     through it)
   */
  public SessionRegistry(DevicePools pools, MemoryBackend backend, SessionSettings settings, Ticker ticker,
      LiveSessions sessions) {
    this.pools = pools;
    this.sessions = sessions;
    this.backend = backend;
    this.settings = settings;
    this.ticker = ticker;
    this.churn = new SessionChurn(log, ticker.nanos());
    this.sharing = new SharedObjects(this, pools, settings.sharing(), ticker);
  }

  /** Share tokens and published objects. */
  public SharedObjects sharing() {
    return sharing;
  }

  public SessionSettings settings() {
    return settings;
  }

  /** The pools' oversize rule, told to each client at OpenSession so that its cache agrees. */
  public long maxOversizeBytes() {
    return pools.maxOversizeBytes();
  }

  // ------------------------------------------------------------------------------ sessions

  /** Opens a session of the daemon's own tenant with the default client cache allowance. */
  public Session open(String clientName, int ttlSeconds) {
    return open(Caller.DAEMON, clientName, ttlSeconds, -1);
  }

  /** Opens a session of the daemon's own tenant (in-process callers). */
  public Session open(String clientName, int ttlSeconds, long cacheBytes) {
    return open(Caller.DAEMON, clientName, ttlSeconds, cacheBytes);
  }

  /**
   * Opens a session; {@code ttlSeconds} 0 takes the default, larger ones are capped.
   *
   * @param cacheBytes the client cache allowance asked for: negative = the default, 0 = none,
   *     else at most that (never more than the default)
   */
  public Session open(Caller caller, String clientName, int ttlSeconds, long cacheBytes) {
    checkNotDraining();
    Validation.label("client_name", clientName);
    int ttl = ttlSeconds <= 0 ? settings.defaultTtlSeconds() : Math.min(ttlSeconds, settings.maxTtlSeconds());
    long allowance = cacheBytes < 0 ? settings.clientCacheBytes() : Math.min(cacheBytes, settings.clientCacheBytes());
    Tenant tenant = tenants.computeIfAbsent(caller.tenant(), Tenant::new);
    admit(caller, tenant);
    Session session;
    try {
      String id = SecureIds.next();
      session = new Session(id, caller, tenant, segmentOwner(caller, id), clientName, ttl,
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
   * Takes a session's places within the {@link SessionLimits}: a token of the tenant's open
   * rate, a place among the tenant's sessions, a place among all sessions. The daemon's own
   * caller is held to the total only (see {@link SessionLimits}).
   *
   * @throws ExhaustedException naming the limit and its flag, having taken nothing
   */
  private void admit(Caller caller, Tenant tenant) {
    SessionLimits limits = settings.limits();
    boolean peer = caller != Caller.DAEMON;
    if (peer && limits.openRatePerSecond() > 0) {
      long waitMillis = tenant.takeOpenToken(ticker.nanos(), limits.openRatePerSecond());
      if (waitMillis > 0) {
        churn.refusedRate();
        throw new ExhaustedException("session open rate of tenant " + caller.tenant() + " exceeded: at most "
            + limits.openRatePerSecond() + " opens per second (flag --session-open-rate); retry in " + waitMillis
            + " ms");
      }
    }
    if (!tenant.addSession(peer ? limits.maxSessionsPerTenant() : 0)) {
      churn.refusedPerTenant();
      throw new ExhaustedException("session limit of tenant " + caller.tenant() + " reached: "
          + limits.maxSessionsPerTenant() + " live sessions (flag --max-sessions-per-tenant); close sessions "
          + "it no longer uses");
    }
    if (!sessions.reserve(limits.maxSessions())) {
      tenant.removeSession();
      churn.refusedTotal();
      throw new ExhaustedException("session limit of the daemon reached: " + limits.maxSessions()
          + " live sessions over all tenants (flag --max-sessions)");
    }
  }

  /**
   * Blocks are carved from segments of the session's tenant, or of the session alone under
   * per-session isolation. Host segment files go to the tenant's uid (uid tenants) or group
   * (gid tenants) so that its processes, and only they, can map them.
   */
  private SegmentOwner segmentOwner(Caller caller, String sessionId) {
    String key = settings.isolateSessions() ? caller.tenant() + "/" + sessionId : caller.tenant();
    if (caller.tenant().startsWith("uid:")) {
      return new SegmentOwner(key, caller.uid(), -1);
    }
    if (caller.tenant().startsWith("gid:")) {
      return new SegmentOwner(key, -1, caller.gid());
    }
    return new SegmentOwner(key, -1, -1);
  }

  /** A live session of the daemon's own tenant by id (in-process callers); refreshes its TTL. */
  public Session session(String sessionId) {
    return session(Caller.DAEMON, sessionId);
  }

  /**
   * A live session of the caller's tenant by id; refreshes its TTL. Another tenant's session
   * answers exactly like one that never existed, so ids leak nothing.
   */
  public Session session(Caller caller, String sessionId) {
    Session session = find(sessionId);
    if (session == null || !caller.owns(session.tenant())) {
      throw notFound(sessionId);
    }
    session.touch(ticker.nanos());
    return session;
  }

  private Session find(String sessionId) {
    SecureIds.check("session_id", sessionId);
    return sessions.get(sessionId);
  }

  private static NotFoundException notFound(String sessionId) {
    return new NotFoundException("session " + sessionId + " not found (never opened, closed, or expired)");
  }

  /** Closes a session at the client's request (in-process callers). */
  public long[] close(String sessionId) {
    return close(Caller.DAEMON, sessionId);
  }

  /**
   * Ends a session: the caller's own, or any tenant's when the caller is an admin (logged with
   * who asked).
   */
  public long[] close(Caller caller, String sessionId) {
    Session session = find(sessionId);
    if (session == null || !(caller.owns(session.tenant()) || caller.admin())) {
      throw notFound(sessionId);
    }
    if (caller.owns(session.tenant())) {
      return end(session, "closed by the client");
    }
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("admin", caller.principal())
        .log("Admin {} ends {} of tenant {}", caller, session, session.tenant());
    return end(session, "ended by admin " + caller.principal());
  }

  /** Binds a KeepAlive stream to a session of the daemon's own tenant (in-process callers). */
  public Session attach(String sessionId, SessionChannel channel) {
    return attach(Caller.DAEMON, sessionId, channel);
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
    if (draining) {
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
    long bytes = 0;
    long count = 0;
    long holds = 0;
    for (LeaseRecord lease : ending.leases()) {
      if (leases.remove(lease.id(), lease)) {
        if (lease.attached()) {
          holds++;
        } else {
          bytes += lease.block().size();
          count++;
        }
        returnBlock(lease, null);
      }
    }
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
   * Leases a block for a session.
   *
   * @param cachedOnly when true, return null instead of doing anything that needs a backend
   *     call (a miss, or zeroing): the caller retries on a thread that may block
   */
  public LeaseRecord lease(String sessionId, int device, long size, boolean zero, String tag, boolean cachedOnly) {
    return lease(Caller.DAEMON, sessionId, device, size, zero, tag, cachedOnly);
  }

  /**
   * Leases a block for a session of the caller's tenant, within the session's and the
   * tenant's quota.
   *
   * @param cachedOnly when true, return null instead of doing anything that needs a backend
   *     call (a miss, or zeroing): the caller retries on a thread that may block
   */
  public LeaseRecord lease(Caller caller, String sessionId, int device, long size, boolean zero, String tag,
      boolean cachedOnly) {
    checkNotDraining();
    Session session = session(caller, sessionId);
    DevicePool pool = pools.get(device);
    Validation.leaseSize(size, pool);
    Validation.label("tag", tag);
    if (cachedOnly && zero) {
      return null;
    }
    long rounded = SizeClasses.roundUp(size);
    String refused;
    try {
      refused = session.reserve(rounded);
    } catch (IllegalStateException e) {
      throw new NotFoundException("session " + sessionId + " has ended");
    }
    if (refused == null) {
      refused = session.tenantUsage().reserve(rounded, settings.tenantQuota());
      if (refused != null) {
        session.unreserve(rounded);
      }
    }
    if (refused != null) {
      throw new ExhaustedException(session + ": " + refused);
    }
    LeasedBlock leased;
    try {
      leased = cachedOnly ? pool.tryLeaseCached(size, session.id(), session.segmentOwner())
          : pool.lease(size, zero, session.id(), session.segmentOwner());
    } catch (RuntimeException e) {
      session.unreserve(rounded);
      session.tenantUsage().unreserve(rounded);
      throw e;
    }
    if (leased == null) {
      session.unreserve(rounded);
      session.tenantUsage().unreserve(rounded);
      return null;
    }
    Block block = leased.block();
    LeaseRecord lease = new LeaseRecord(SecureIds.next(), session, leased, size, tag, ticker.nanos(),
        leaseSequence.incrementAndGet());
    leases.put(lease.id(), lease);
    if (!session.commit(lease, rounded)) {
      if (leases.remove(lease.id(), lease)) {
        returnBlock(lease, null);
      }
      // The session ended while we were in the pool, after its end() told the pools it maps
      // nothing; our lease re-registered it as a mapper of the segment. Tell the pool again,
      // or an eviction of that segment would wait forever for an unmap.
      pool.holderEnded(session.id());
      throw new NotFoundException("session " + sessionId + " has ended");
    }
    if (log.isDebugEnabled()) {
      log.atDebug().addKeyValue("session", session.id()).addKeyValue("lease", lease.id())
          .log("{}: lease {} of {} bytes on device {} (segment {}, offset {}, {}), tag '{}'", session,
          lease.id(), size, device, block.segmentId(), block.offset(), lease.poolHit() ? "hit" : "miss", tag);
    }
    return lease;
  }

  /**
   * Gives a session of the caller's tenant its own hold on a shared block (Attach, Lookup): a
   * record like a lease, released like one, that keeps the block leased until it goes. The
   * session becomes a mapper of the block's segment before it learns the handle.
   *
   * @throws NotFoundException when the session ended or the block went back meanwhile
   * @throws ExhaustedException at the session's bound on holds
   */
  LeaseRecord hold(Caller caller, String sessionId, SharedBlock shared, boolean readOnly, String tag) {
    checkNotDraining();
    Session session = session(caller, sessionId);
    Validation.label("tag", tag);
    String refused;
    try {
      refused = session.reserveHold(settings.sharing().maxHoldsPerSession());
    } catch (IllegalStateException e) {
      throw new NotFoundException("session " + sessionId + " has ended");
    }
    if (refused != null) {
      throw new ExhaustedException(session + ": " + refused);
    }
    LeaseRecord hold = new LeaseRecord(SecureIds.next(), session, shared, readOnly, tag, ticker.nanos(),
        leaseSequence.incrementAndGet());
    if (!shared.addRecord(hold)) {
      session.unreserveHold();
      throw new NotFoundException("the shared block was released by all its holders");
    }
    DevicePool pool = pools.get(shared.block().device());
    // Cannot fail: the block stays leased while it has a hold, and ours is one.
    pool.attached(shared.block(), session.id());
    leases.put(hold.id(), hold);
    if (!session.commitHold(hold)) {
      if (leases.remove(hold.id(), hold)) {
        returnBlock(hold, null);
      }
      pool.holderEnded(session.id()); // as in lease(): our hold re-registered it as a mapper
      throw new NotFoundException("session " + sessionId + " has ended");
    }
    log.atDebug().addKeyValue("session", session.id()).addKeyValue("lease", hold.id())
        .log("{}: hold {} on block of segment {} offset {} ({} holds{})", session, hold.id(),
        shared.block().segmentId(), shared.block().offset(), shared.holds(), readOnly ? ", read-only" : "");
    return hold;
  }

  /**
   * A live lease or hold of the session by id, for Share and Publish.
   *
   * @throws NotFoundException as Release would
   */
  LeaseRecord record(Session session, String leaseId) {
    SecureIds.check("lease_id", leaseId);
    LeaseRecord lease = leases.get(leaseId);
    if (lease == null || lease.session() != session) {
      throw new NotFoundException("lease " + leaseId + " not found in this session (unknown, already released, "
          + "or held by another session)");
    }
    return lease;
  }

  /**
   * Releases a lease of a session; with a completion event the block is reused once it fires.
   *
   * @throws NotFoundException for an unknown lease, another session's lease, or a repeat
   */
  public void release(String sessionId, String leaseId, byte[] eventHandle) {
    release(Caller.DAEMON, sessionId, leaseId, eventHandle);
  }

  /** Releases a lease of a session of the caller's tenant; see {@link #release(String, String, byte[])}. */
  public void release(Caller caller, String sessionId, String leaseId, byte[] eventHandle) {
    Session session = session(caller, sessionId);
    SecureIds.check("lease_id", leaseId);
    Validation.eventHandle(eventHandle);
    LeaseRecord lease = leases.get(leaseId);
    if (lease == null || lease.session() != session) {
      // The same answer for "never existed" and "someone else's": ids are not probeable.
      throw new NotFoundException("lease " + leaseId + " not found in this session (unknown, already released, or held by another session)");
    }
    CompletionEvent event = eventHandle.length == 0 ? null
        : backend.openEvent(lease.block().device(), eventHandle);
    if (!leases.remove(leaseId, lease)) {
      if (event != null) {
        event.close();
      }
      throw new NotFoundException("lease " + leaseId + " was already released");
    }
    session.forget(lease);
    returnBlock(lease, event);
    long restored = session.restoreTrustIfReturned();
    if (restored >= 0) {
      log.info("{} gave back its client-cached blocks: client cache allowance {} restored", session,
          Sizes.format(restored));
      SessionChannel channel = session.channel();
      if (channel != null) {
        channel.cacheAllowance(restored);
      }
    }
  }

  // ------------------------------------------------------------------------ client cache

  /**
   * The client closed leases into its cache tier (a batch of its notices). Each is counted as
   * client-cached only while the session's client-cached bytes stay within its allowance.
   *
   * @return the notices refused (unknown, another session's, already cached, beyond the
   *     allowance), each with why
   */
  public List<NoticeRefusal> cached(Session session, List<String> leaseIds) {
    List<NoticeRefusal> refused = new ArrayList<>(0);
    for (String id : leaseIds) {
      LeaseRecord lease = ownLease(session, id);
      Session.CacheAnswer answer = lease == null ? Session.CacheAnswer.NOT_CACHEABLE : session.markCached(lease);
      if (answer == Session.CacheAnswer.OVER_ALLOWANCE) {
        refused.add(new NoticeRefusal(id, new ExhaustedException("lease " + id + " cannot be client-cached: "
            + session + " keeps " + session.clientCachedBytes() + " bytes cached and its block of "
            + lease.block().size() + " bytes would exceed the client cache allowance of " + session.cacheAllowance()
            + " bytes (granted at OpenSession; flag --client-cache-bytes); release it instead")));
        continue;
      }
      if (answer == Session.CacheAnswer.NOT_CACHEABLE) {
        refused.add(new NoticeRefusal(id,
            new NotFoundException("lease " + id + " cannot be client-cached: not a leased block of this session")));
        continue;
      }
      try {
        pools.get(lease.block().device()).clientCached(lease.block(), session.id());
      } catch (IllegalStateException e) {
        // Released meanwhile by a unary Release (another HTTP/2 stream): nothing left to cache.
        session.markReused(lease);
        refused.add(new NoticeRefusal(id, new NotFoundException("lease " + id + " cannot be client-cached: it was released")));
      }
    }
    return refused;
  }

  /**
   * The client handed cached leases out again locally (a batch of its notices).
   *
   * @return the notices refused, each with why
   */
  public List<NoticeRefusal> reused(Session session, List<String> leaseIds) {
    List<NoticeRefusal> refused = new ArrayList<>(0);
    for (String id : leaseIds) {
      LeaseRecord lease = ownLease(session, id);
      if (lease == null || !session.markReused(lease)) {
        refused.add(new NoticeRefusal(id,
            new NotFoundException("lease " + id + " cannot be reused: not a client-cached lease of this session")));
        continue;
      }
      try {
        pools.get(lease.block().device()).clientReused(lease.block());
      } catch (IllegalStateException e) {
        refused.add(new NoticeRefusal(id, new NotFoundException("lease " + id + " cannot be reused: it was released")));
      }
    }
    return refused;
  }

  /** The client's cumulative cache counters for a device; what is new goes to the pool's. */
  public void clientCounters(Session session, int device, long hits, long returns) {
    DevicePool pool = pools.get(device);
    long[] delta = session.counterDeltas(device, hits, returns);
    if (delta[0] > 0 || delta[1] > 0) {
      pool.addClientCounters(delta[0], delta[1]);
    }
  }

  private LeaseRecord ownLease(Session session, String leaseId) {
    if (!SecureIds.isWellFormed(leaseId)) {
      return null;
    }
    LeaseRecord lease = leases.get(leaseId);
    return lease != null && lease.session() == session ? lease : null;
  }

  /**
   * Gives a lease's block back to its pool and its bytes back to the tenant's quota; for a
   * shared block, drops the record's hold and gives the block back only with the last one.
   */
  private void returnBlock(LeaseRecord lease, CompletionEvent event) {
    Block block = lease.block();
    SharedBlock shared = lease.markReleased();
    if (lease.attached()) {
      pools.get(block.device()).holdReleased();
    }
    if (shared == null) {
      pools.get(block.device()).release(block, event);
      lease.session().tenantUsage().unreserve(SizeClasses.roundUp(lease.sizeBytes()));
    } else if (shared.dropRecord(lease, event)) {
      giveBack(shared);
    }
    if (lease.leakReported) {
      log.atInfo().addKeyValue("lease", lease.id()).addKeyValue("session", lease.session().id())
          .log("Lease {} of {} returned after {} ms (previously reported as possibly leaked)",
          lease.id(), lease.session(), ageMillis(lease.grantedNanos()));
    }
  }

  /** The holdings of a tenant by key (created on first use). */
  Tenant tenant(String key) {
    return tenants.computeIfAbsent(key, Tenant::new);
  }

  /** The last hold on a shared block is gone: the block goes back, the tenant's quota too. */
  void giveBack(SharedBlock shared) {
    Block block = shared.block();
    DevicePool pool = pools.get(block.device());
    pool.sharedBlockReturned();
    pool.release(block, shared.takeEvents());
    shared.leasedBy().tenantUsage().unreserve(SizeClasses.roundUp(shared.sizeBytes()));
    log.atDebug().log("Shared block of segment {} offset {} returned: its last hold is gone", block.segmentId(),
        block.offset());
  }

  // ------------------------------------------------------------------------------ housekeeping

  /**
   * Ends sessions whose stream stayed away past the grace period or whose TTL passed without
   * keep-alive, and reports leases held past the leak threshold. Called periodically.
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
    long leakNanos = TimeUnit.MILLISECONDS.toNanos(settings.leakThresholdMillis());
    // Scanning every lease is O(leases): do it a few times per threshold, not on every reap.
    long scanEvery = Math.max(TimeUnit.MILLISECONDS.toNanos(100), Math.min(leakNanos / 10, TimeUnit.SECONDS.toNanos(5)));
    if (leakNanos > 0 && now - lastLeakScanNanos >= scanEvery) {
      lastLeakScanNanos = now;
      for (LeaseRecord lease : leases.values()) {
        if (!lease.leakReported && now - lease.grantedNanos() > leakNanos) {
          lease.leakReported = true;
          log.atWarn().addKeyValue("lease", lease.id()).addKeyValue("session", lease.session().id())
              .addKeyValue("client", lease.session().clientName()).addKeyValue("device", lease.block().device())
              .addKeyValue("size_bytes", lease.sizeBytes()).addKeyValue("tag", lease.tag())
              .log("Possible leak: lease {} held for {} ms by session {} ('{}'): device {}, {} bytes, tag '{}'",
              lease.id(), (now - lease.grantedNanos()) / 1_000_000, lease.session().id(),
              lease.session().clientName(), lease.block().device(), lease.sizeBytes(), lease.tag());
        }
      }
    }
  }

  /** Stops taking sessions and leases and tells every attached client. */
  public void beginDrain(long drainMillis) {
    draining = true;
    for (Session session : sessions.all()) {
      SessionChannel channel = session.channel();
      if (channel != null) {
        channel.shutdownNotice(drainMillis);
      }
    }
  }

  public boolean draining() {
    return draining;
  }

  /** Ends every session, then drops every share token and published name (shutdown). */
  public void endAll(String reason) {
    for (Session session : sessions.all()) {
      end(session, reason);
    }
    sharing.dropAll(reason);
  }

  void checkNotDraining() {
    if (draining) {
      throw new DrainingException("gpumemd is shutting down and takes no new sessions or leases");
    }
  }

  // ------------------------------------------------------------------------------ listing

  public int liveLeases() {
    return leases.size();
  }

  public List<LeaseRecord> leases(Integer device, String sessionId) {
    return leases(Caller.DAEMON, device, sessionId);
  }

  /** Live leases in grant order: every tenant's for an admin, else the caller's tenant's only. */
  public List<LeaseRecord> leases(Caller caller, Integer device, String sessionId) {
    if (!sessionId.isEmpty()) {
      SecureIds.check("session_id", sessionId);
    }
    if (device != null) {
      pools.get(device);
    }
    List<LeaseRecord> out = new ArrayList<>();
    for (LeaseRecord lease : leases.values()) {
      if ((device == null || lease.block().device() == device)
          && (sessionId.isEmpty() || lease.session().id().equals(sessionId))
          && (caller.admin() || caller.owns(lease.session().tenant()))) {
        out.add(lease);
      }
    }
    out.sort(Comparator.comparingLong(LeaseRecord::sequence));
    return out;
  }

  /** Leases in grant order, the order of {@link #leasePage}. */
  public static final Comparator<LeaseRecord> LEASE_ORDER = Comparator.comparingLong(LeaseRecord::sequence);
  /** Sessions by age, then id (sessions opened in the same nanosecond), the order of {@link #sessionPage}. */
  public static final Comparator<Session> SESSION_ORDER =
      Comparator.comparingLong(Session::openedNanos).thenComparing(Session::id);

  /**
   * A page of live leases in grant order, after the lease with sequence number
   * {@code afterSequence} (0 for the first page): every tenant's for an admin, else the caller's
   * tenant's only.
   */
  public Page<LeaseRecord> leasePage(Caller caller, Integer device, String sessionId, long afterSequence, int size) {
    if (!sessionId.isEmpty()) {
      SecureIds.check("session_id", sessionId);
    }
    if (device != null) {
      pools.get(device);
    }
    return Page.select(leases.values(),
        lease -> (device == null || lease.block().device() == device)
            && (sessionId.isEmpty() || lease.session().id().equals(sessionId))
            && (caller.admin() || caller.owns(lease.session().tenant())),
        lease -> lease.sequence() > afterSequence, LEASE_ORDER, size);
  }

  /**
   * A page of live sessions by age, after the session that opened at {@code afterNanos} with id
   * {@code afterId} (null for the first page): every tenant's for an admin, else the caller's
   * tenant's only.
   */
  public Page<Session> sessionPage(Caller caller, long afterNanos, String afterId, int size) {
    return Page.select(sessions.all(), s -> caller.admin() || caller.owns(s.tenant()),
        s -> afterId == null || s.openedNanos() > afterNanos
            || (s.openedNanos() == afterNanos && s.id().compareTo(afterId) > 0),
        SESSION_ORDER, size);
  }

  public int sessionCount() {
    return sessions.size();
  }

  public List<Session> sessions() {
    return sessions(Caller.DAEMON);
  }

  /** Live sessions by age: every tenant's for an admin, else the caller's tenant's only. */
  public List<Session> sessions(Caller caller) {
    List<Session> out = new ArrayList<>(sessions.all());
    if (!caller.admin()) {
      out.removeIf(s -> !caller.owns(s.tenant()));
    }
    out.sort(Comparator.comparingLong(Session::openedNanos));
    return out;
  }

  /** Segments a session may have mapped, over all devices. */
  public int mappedSegments(Session session) {
    int total = 0;
    for (DevicePool pool : pools.all()) {
      total += pool.mappedSegments(session.id());
    }
    return total;
  }

  public long ageMillis(long sinceNanos) {
    return (ticker.nanos() - sinceNanos) / 1_000_000;
  }
}
