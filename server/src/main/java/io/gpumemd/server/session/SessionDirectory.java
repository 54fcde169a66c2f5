package io.gpumemd.server.session;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.books.LeaseHolder;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.books.Tenant;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.sharing.HolderDirectory;
import io.gpumemd.server.error.DrainingException;
import io.gpumemd.server.error.NotFoundException;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Finding a live session for a caller, and the tenants sessions belong to: what the {@link
 * SessionRegistry} and sharing ({@link HolderDirectory}) both need before they act, whether the
 * daemon still takes new sessions, leases and holds, and whether a caller may open one more
 * session ({@link #admit}).
 *
 * <p>Rule: another tenant's session answers exactly like one that never existed (NOT_FOUND),
 * and so does an ended one, so ids leak nothing.
 *
 * <p>Thread-safe: concurrent maps and a volatile flag.
 */
final class SessionDirectory implements HolderDirectory {
  private final LiveSessions sessions;
  private final Ticker ticker;
  /** Holdings by tenant key; one entry per tenant ever seen (uids, token tenants: bounded by who can connect). */
  private final ConcurrentHashMap<String, Tenant> tenants = new ConcurrentHashMap<>();
  private volatile boolean draining;

  SessionDirectory(LiveSessions sessions, Ticker ticker) {
    this.sessions = sessions;
    this.ticker = ticker;
  }

  /**
   * A live session of the caller's tenant by id; refreshes its TTL.
   *
   * @throws NotFoundException for another tenant's session as for an unknown one
   */
  @Override
  public Session session(Caller caller, String sessionId) {
    Session session = get(sessionId);
    if (session == null || !caller.owns(session.tenant())) {
      throw notFound(sessionId);
    }
    session.touch(ticker.nanos());
    return session;
  }

  /**
   * Takes a session's places within the {@link SessionLimits}: a token of the tenant's open
   * rate, a place among the tenant's sessions, a place among all sessions. The daemon's own
   * caller is held to the total only (see {@link SessionLimits}).
   *
   * @throws ExhaustedException naming the limit and its flag, having taken nothing
   */
  void admit(Caller caller, Tenant tenant, SessionLimits limits, SessionChurn churn) {
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

  /** A live session by id, whoever's, or null. */
  Session get(String sessionId) {
    SecureIds.check("session_id", sessionId);
    return sessions.get(sessionId);
  }

  /**
   * A live session of the caller's tenant, or of any tenant for an admin; another tenant's
   * session answers like one that never existed (NOT_FOUND).
   */
  Session ofTenantOrAdmin(Caller caller, String sessionId) {
    Session session = get(sessionId);
    if (session == null || !(caller.owns(session.tenant()) || caller.admin())) {
      throw notFound(sessionId);
    }
    return session;
  }

  static NotFoundException notFound(String sessionId) {
    return new NotFoundException("session " + sessionId + " not found (never opened, closed, or expired)");
  }

  /** The holdings of a tenant by key (created on first use). */
  @Override
  public Tenant tenant(String key) {
    return tenants.computeIfAbsent(key, Tenant::new);
  }

  /**
   * Blocks are carved from segments of the session's tenant, or of the session alone under
   * per-session isolation. Host segment files go to the tenant's uid (uid tenants) or group
   * (gid tenants) so that its processes, and only they, can map them.
   */
  static SegmentOwner segmentOwner(Caller caller, String sessionId, boolean isolateSessions) {
    String key = isolateSessions ? caller.tenant() + "/" + sessionId : caller.tenant();
    if (caller.tenant().startsWith("uid:")) {
      return new SegmentOwner(key, caller.uid(), -1);
    }
    if (caller.tenant().startsWith("gid:")) {
      return new SegmentOwner(key, -1, caller.gid());
    }
    return new SegmentOwner(key, -1, -1);
  }

  @Override
  public SegmentOwner segmentOwner(LeaseHolder session) {
    return ((Session) session).segmentOwner();
  }

  @Override
  public void checkNotDraining() {
    if (draining) {
      throw new DrainingException("gpumemd is shutting down and takes no new sessions or leases");
    }
  }

  void beginDraining() {
    draining = true;
  }

  boolean draining() {
    return draining;
  }
}
