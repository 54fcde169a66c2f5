package io.gpumemd.server.books;

import io.gpumemd.server.error.ExhaustedException;

/**
 * One tenant's holdings across all its sessions, checked against the per-tenant quota: without
 * it, a per-session quota is no limit at all for a peer that opens many sessions. Also the
 * tenant's live session count and its session-open token bucket ({@code SessionLimits}), its
 * live share tokens and names, and the holds its sessions took by Attach and Lookup.
 *
 * <p>Thread-safety: all state is guarded by this object's monitor; every method is short.
 */
public final class Tenant {
  private final String key;
  /** Leases of all its sessions, held or being made, against the tenant quota. */
  private final QuotaCount usage;
  private int sessions;
  /** Live share tokens and published names: they outlive sessions, so they are counted here. */
  private int shares;
  /** Holds of its sessions on shared blocks, taken or being taken (see {@link #reserveHold}). */
  private int holds;
  /** Session-open tokens left, and when they were last topped up (ticker nanos). */
  private double openTokens = Double.NaN;
  private long tokensAtNanos;

  public Tenant(String key) {
    this.key = key;
    this.usage = new QuotaCount(new QuotaCount.Label("tenant", " for " + key, " over all its sessions",
        "--tenant-max-leases", "--tenant-max-leased-bytes"));
  }

  /**
   * Counts a lease about to be made against {@code quota}, besides {@code pinnedBytes} of
   * released memory its processes may still map.
   *
   * @param who who asked, named first in a refusal (null: nobody)
   * @throws ExhaustedException naming the quota and its flag, having counted nothing
   */
  public synchronized void reserve(long leaseBytes, long pinnedBytes, Quota quota, Object who) {
    usage.take(leaseBytes, pinnedBytes, quota, who);
  }

  /** A lease counted by {@link #reserve} is gone (released, refused, or its session ended). */
  synchronized void unreserve(long leaseBytes) {
    usage.give(leaseBytes);
  }

  /**
   * Takes one session-open token from the tenant's bucket: {@code ratePerSecond} tokens a
   * second, at most {@code ratePerSecond} saved up (the burst), full at first.
   *
   * @return 0 when taken, else the milliseconds until the next token (at least 1)
   */
  public synchronized long takeOpenToken(long nowNanos, int ratePerSecond) {
    if (Double.isNaN(openTokens)) {
      openTokens = ratePerSecond;
    } else {
      openTokens = Math.min(ratePerSecond, openTokens + (nowNanos - tokensAtNanos) * ratePerSecond / 1e9);
    }
    tokensAtNanos = nowNanos;
    if (openTokens >= 1) {
      openTokens -= 1;
      return 0;
    }
    return Math.max(1, (long) Math.ceil((1 - openTokens) * 1000 / ratePerSecond));
  }

  /**
   * Counts a session about to open against {@code max} (0 = no limit).
   *
   * @return false, counting nothing, when the tenant already has {@code max} live sessions
   */
  public synchronized boolean addSession(int max) {
    if (max > 0 && sessions >= max) {
      return false;
    }
    sessions++;
    return true;
  }

  /** A session counted by {@link #addSession} ended (or was never opened after all). */
  public synchronized void removeSession() {
    sessions--;
  }

  /**
   * Counts a share token or published name about to be made against {@code max} (0 = no bound).
   *
   * @return false, counting nothing, at the bound
   */
  public synchronized boolean addShare(int max) {
    if (max > 0 && shares >= max) {
      return false;
    }
    shares++;
    return true;
  }

  /** A token or name counted by {@link #addShare} is gone. */
  public synchronized void removeShare() {
    shares--;
  }

  /**
   * Counts a hold about to be taken by one of the tenant's sessions against {@code max} (0 = no
   * bound). The lease book returns it when the hold ends, however it ends.
   *
   * @param who who asked, named first in a refusal (null: nobody)
   * @throws ExhaustedException at the bound, having counted nothing
   */
  public synchronized void reserveHold(int max, Object who) {
    if (max > 0 && holds >= max) {
      throw new ExhaustedException(QuotaCount.prefix(who) + "tenant " + key + " has " + holds + " holds on shared "
          + "blocks over all its sessions, the bound of " + max + " (flag --max-holds-per-tenant); release holds it no "
          + "longer needs");
    }
    holds++;
  }

  /** A hold counted by {@link #reserveHold} ended, or was never taken after all. */
  synchronized void unreserveHold() {
    holds--;
  }

  public synchronized int holds() {
    return holds;
  }

  public synchronized int shares() {
    return shares;
  }

  public synchronized int sessions() {
    return sessions;
  }

  public synchronized long[] holdings() {
    return new long[] {usage.leases(), usage.bytes()};
  }

  public String key() {
    return key;
  }
}
