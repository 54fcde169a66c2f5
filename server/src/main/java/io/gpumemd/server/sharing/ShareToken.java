package io.gpumemd.server.sharing;

import io.gpumemd.server.books.LeaseHolder;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.SharedBlock;

/**
 * A share token: the right, for sessions of its tenant, to attach to one shared block, until
 * it expires, is revoked, or has served {@code maxAttaches} attaches. While valid it is itself
 * a hold on the block. Created by {@link SharedObjects}.
 *
 * <p>Two names: the token itself, a bearer secret that only its maker learns and that nothing
 * else shows, and a public {@link #id()} by which listings and {@code Admin.RemoveShare} name
 * it. Knowing the id grants nothing: it attaches nobody, and revoking by id is allowed to the
 * token's tenant and to admins only.
 *
 * <p>Thread-safety: identity fields are immutable; the use count and the dead flag are guarded
 * by this object's monitor, so that exactly one caller kills a token (and drops its hold).
 */
public final class ShareToken {
  /** The secret; package-private so that no listing can reach it. */
  final String token;
  final String id;
  final String tenant;
  final SharedBlock shared;
  final boolean readOnly;
  final int maxAttaches;
  final long createdNanos;
  final long expiresNanos;
  /** The session that made it and the lease it shared, as they were then (either may be gone). */
  private final String sessionId;
  private final String leaseId;
  private final String clientName;
  private int attaches;
  private boolean dead;

  ShareToken(String token, String id, LeaseHolder maker, LeaseRecord lease, SharedBlock shared, boolean readOnly,
      int maxAttaches, long createdNanos, long expiresNanos) {
    this(token, id, maker.tenant(), maker.id(), maker.clientName(), lease.id(), shared, readOnly, maxAttaches,
        createdNanos, expiresNanos, 0, false);
  }

  /** A token as made here, or as restored from a snapshot. */
  public ShareToken(String token, String id, String tenant, String sessionId, String clientName, String leaseId,
      SharedBlock shared, boolean readOnly, int maxAttaches, long createdNanos, long expiresNanos, int attaches,
      boolean dead) {
    this.token = token;
    this.id = id;
    this.tenant = tenant;
    this.sessionId = sessionId;
    this.clientName = clientName;
    this.leaseId = leaseId;
    this.attaches = attaches;
    this.dead = dead;
    this.shared = shared;
    this.readOnly = readOnly;
    this.maxAttaches = maxAttaches;
    this.createdNanos = createdNanos;
    this.expiresNanos = expiresNanos;
  }

  boolean expired(long nowNanos) {
    return nowNanos - expiresNanos >= 0;
  }

  /**
   * Counts one attach.
   *
   * @return -1 when the token is dead (nothing counted), 0 when it stays valid, 1 when this
   *     was its last use: it is dead now and the caller drops its hold
   */
  synchronized int use() {
    if (dead) {
      return -1;
    }
    attaches++;
    if (maxAttaches > 0 && attaches >= maxAttaches) {
      dead = true;
      return 1;
    }
    return 0;
  }

  /** @return true for the one caller that kills a live token (and drops its hold) */
  synchronized boolean kill() {
    if (dead) {
      return false;
    }
    dead = true;
    return true;
  }

  // ------------------------------------------------------------------------------ for listings

  /**
   * The secret itself, for the take-over snapshot only: no listing shows it (they show {@link
   * #id()}).
   */
  public String secret() {
    return token;
  }

  /** The public id (32 hex characters, not the token). */
  public String id() {
    return id;
  }

  public String tenant() {
    return tenant;
  }

  /** The session that made the token (it may have ended since). */
  public String sessionId() {
    return sessionId;
  }

  public String clientName() {
    return clientName;
  }

  /** The lease or hold that was shared (it may have been released since: the token holds the block). */
  public String leaseId() {
    return leaseId;
  }

  public SharedBlock shared() {
    return shared;
  }

  public boolean readOnly() {
    return readOnly;
  }

  /** Attaches the token serves in all; 0 = any number until it expires. */
  public int maxAttaches() {
    return maxAttaches;
  }

  /** Killed: revoked, used up or expired (then dropped by whoever killed it). */
  public synchronized boolean dead() {
    return dead;
  }

  /** Attaches served so far. */
  public synchronized int attaches() {
    return attaches;
  }

  public long createdNanos() {
    return createdNanos;
  }

  public long expiresNanos() {
    return expiresNanos;
  }
}
