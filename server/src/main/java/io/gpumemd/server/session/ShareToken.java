package io.gpumemd.server.session;

/**
 * A share token: the right, for sessions of its tenant, to attach to one shared block, until
 * it expires, is revoked, or has served {@code maxAttaches} attaches. While valid it is itself
 * a hold on the block. Created by {@link SharedObjects}.
 *
 * <p>Thread-safety: identity fields are immutable; the use count and the dead flag are guarded
 * by this object's monitor, so that exactly one caller kills a token (and drops its hold).
 */
final class ShareToken {
  final String token;
  final String tenant;
  final SharedBlock shared;
  final boolean readOnly;
  final int maxAttaches;
  final long expiresNanos;
  private int attaches;
  private boolean dead;

  ShareToken(String token, String tenant, SharedBlock shared, boolean readOnly, int maxAttaches, long expiresNanos) {
    this.token = token;
    this.tenant = tenant;
    this.shared = shared;
    this.readOnly = readOnly;
    this.maxAttaches = maxAttaches;
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
}
