package io.gpumemd.server.session;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.DrainingException;
import io.gpumemd.server.error.NotFoundException;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Finding a live session for a caller, and the tenants sessions belong to: what the {@link
 * SessionRegistry} and {@link SharedObjects} both need before they act, and whether the daemon
 * still takes new sessions, leases and holds.
 *
 * <p>Rule: another tenant's session answers exactly like one that never existed (NOT_FOUND),
 * and so does an ended one, so ids leak nothing.
 *
 * <p>Thread-safe: concurrent maps and a volatile flag.
 */
final class SessionDirectory {
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
  Session session(Caller caller, String sessionId) {
    Session session = get(sessionId);
    if (session == null || !caller.owns(session.tenant())) {
      throw notFound(sessionId);
    }
    session.touch(ticker.nanos());
    return session;
  }

  /** A live session by id, whoever's, or null. */
  Session get(String sessionId) {
    SecureIds.check("session_id", sessionId);
    return sessions.get(sessionId);
  }

  static NotFoundException notFound(String sessionId) {
    return new NotFoundException("session " + sessionId + " not found (never opened, closed, or expired)");
  }

  /** The holdings of a tenant by key (created on first use). */
  Tenant tenant(String key) {
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

  void checkNotDraining() {
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
