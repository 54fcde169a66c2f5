package io.gpumemd.server.books;

import io.gpumemd.server.error.ExhaustedException;

/**
 * Leases and bytes counted against a {@link Quota}, held or being made: the one check that a
 * session's quota and its tenant's quota share. A refusal names the quota, what is counted and
 * the flag that sets it.
 *
 * <p>Not thread-safe: its owner's monitor guards it ({@link LeaseHolder}, {@link Tenant}).
 */
final class QuotaCount {
  /**
   * How refusals read: "{scope} quota max-leases=N reached{forWhom} (C leases held or in
   * progress{over}; flag {leasesFlag})".
   */
  record Label(String scope, String forWhom, String over, String leasesFlag, String bytesFlag) {}

  private final Label label;
  private long leases;
  private long bytes;

  QuotaCount(Label label) {
    this.label = label;
  }

  /**
   * Counts one more lease of {@code add} bytes.
   *
   * @param who who asked, named first in a refusal (null: nobody); made a string only then, not
   *     on every lease
   * @throws ExhaustedException when {@code quota} would be exceeded, having counted nothing
   */
  void take(long add, Quota quota, Object who) {
    take(add, 0, quota, who);
  }

  /**
   * Counts one more lease of {@code add} bytes, where {@code pinned} bytes that are no lease
   * count against the byte quota too (released memory the owner's processes may still map).
   *
   * @throws ExhaustedException when {@code quota} would be exceeded, having counted nothing
   */
  void take(long add, long pinned, Quota quota, Object who) {
    if (quota.maxLeases() > 0 && leases + 1 > quota.maxLeases()) {
      throw new ExhaustedException(prefix(who) + label.scope() + " quota max-leases=" + quota.maxLeases() + " reached"
          + label.forWhom() + " (" + leases + " leases held or in progress" + label.over() + "; flag "
          + label.leasesFlag() + ")");
    }
    if (quota.maxLeasedBytes() > 0 && bytes + pinned + add > quota.maxLeasedBytes()) {
      throw new ExhaustedException(prefix(who) + label.scope() + " quota max-leased-bytes=" + quota.maxLeasedBytes()
          + " would be exceeded" + label.forWhom() + " (" + bytes + " held" + label.over() + (pinned == 0 ? ""
          : ", " + pinned + " released but still mapped by its processes (they keep it until they exit or unmap "
          + "it)") + ", " + add + " requested; flag " + label.bytesFlag() + ")");
    }
    leases++;
    bytes += add;
  }

  /** What a refusal begins with: who asked. */
  static String prefix(Object who) {
    return who == null ? "" : who + ": ";
  }

  /**
   * Counts a lease without checking any quota: a lease restored from a snapshot stays leased
   * even when it is over the quota in force now.
   */
  void add(long bytes) {
    leases++;
    this.bytes += bytes;
  }

  /** A lease counted by {@link #take} is gone, with {@code less} bytes. */
  void give(long less) {
    leases--;
    bytes -= less;
  }

  /** The bytes of a counted lease changed (its block is larger than the request rounded). */
  void resize(long delta) {
    bytes += delta;
  }

  long leases() {
    return leases;
  }

  long bytes() {
    return bytes;
  }
}
