package io.gpumemd.server.session;

/**
 * One tenant's holdings across all its sessions, checked against the per-tenant quota: without
 * it, a per-session quota is no limit at all for a peer that opens many sessions.
 *
 * <p>Thread-safety: all state is guarded by this object's monitor; every method is short.
 */
final class Tenant {
  private final String key;
  private long bytes;
  private long leases;

  Tenant(String key) {
    this.key = key;
  }

  /**
   * Counts a lease about to be made against {@code quota}.
   *
   * @return null when counted, else the quota that would be exceeded, as a message
   */
  synchronized String reserve(long leaseBytes, Quota quota) {
    if (quota.maxLeases() > 0 && leases + 1 > quota.maxLeases()) {
      return "tenant quota max-leases=" + quota.maxLeases() + " reached for " + key + " (" + leases
          + " leases held or in progress over all its sessions; flag --tenant-max-leases)";
    }
    if (quota.maxLeasedBytes() > 0 && bytes + leaseBytes > quota.maxLeasedBytes()) {
      return "tenant quota max-leased-bytes=" + quota.maxLeasedBytes() + " would be exceeded for " + key + " ("
          + bytes + " held over all its sessions, " + leaseBytes + " requested; flag --tenant-max-leased-bytes)";
    }
    bytes += leaseBytes;
    leases++;
    return null;
  }

  /** A lease counted by {@link #reserve} is gone (released, refused, or its session ended). */
  synchronized void unreserve(long leaseBytes) {
    bytes -= leaseBytes;
    leases--;
  }

  synchronized long[] holdings() {
    return new long[] {leases, bytes};
  }

  String key() {
    return key;
  }
}
