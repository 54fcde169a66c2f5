package io.gpumemd.server.session;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A client's connection-scoped identity and what it holds. Owned by the {@link
 * SessionRegistry}.
 *
 * <p>Thread-safety: the lease set, byte counts and the ended flag are guarded by the session's
 * monitor; the keep-alive fields are volatile and written by the gRPC threads and the reaper.
 */
public final class Session {
  private final String id;
  private final String clientName;
  private final int ttlSeconds;
  private final Quota quota;
  private final long openedNanos;

  volatile long lastSeenNanos;
  volatile SessionChannel channel;
  /** When the last stream detached; meaningful while {@code channel == null && hadStream}. */
  volatile long detachedNanos;
  volatile boolean hadStream;

  // guarded by this
  private final Map<String, LeaseRecord> leases = new HashMap<>();
  private long leasedBytes;
  private long reservedBytes;
  private long reservedLeases;
  private boolean ended;

  Session(String id, String clientName, int ttlSeconds, Quota quota, long nowNanos) {
    this.id = id;
    this.clientName = clientName;
    this.ttlSeconds = ttlSeconds;
    this.quota = quota;
    this.openedNanos = nowNanos;
    this.lastSeenNanos = nowNanos;
  }

  public String id() {
    return id;
  }

  public String clientName() {
    return clientName;
  }

  public int ttlSeconds() {
    return ttlSeconds;
  }

  public Quota quota() {
    return quota;
  }

  public long openedNanos() {
    return openedNanos;
  }

  public boolean streamAttached() {
    return channel != null;
  }

  /** Live leases and the bytes they hold, read together. */
  public synchronized long[] holdings() {
    return new long[] {leases.size(), leasedBytes};
  }

  synchronized boolean ended() {
    return ended;
  }

  /**
   * Reserves quota for a lease about to be made.
   *
   * @return null when reserved, else the quota that would be exceeded, as a message
   */
  synchronized String reserve(long bytes) {
    if (ended) {
      return "";
    }
    long count = leases.size() + reservedLeases + 1;
    long total = leasedBytes + reservedBytes + bytes;
    if (quota.maxLeases() > 0 && count > quota.maxLeases()) {
      return "session quota max-leases=" + quota.maxLeases() + " reached (" + (count - 1)
          + " leases held or in progress)";
    }
    if (quota.maxLeasedBytes() > 0 && total > quota.maxLeasedBytes()) {
      return "session quota max-leased-bytes=" + quota.maxLeasedBytes() + " would be exceeded ("
          + (leasedBytes + reservedBytes) + " held, " + bytes + " requested)";
    }
    reservedBytes += bytes;
    reservedLeases++;
    return null;
  }

  synchronized void unreserve(long bytes) {
    reservedBytes -= bytes;
    reservedLeases--;
  }

  /** Turns a reservation into a held lease; false if the session ended meanwhile. */
  synchronized boolean commit(LeaseRecord lease, long reserved) {
    reservedBytes -= reserved;
    reservedLeases--;
    if (ended) {
      return false;
    }
    leases.put(lease.id(), lease);
    leasedBytes += lease.block().size();
    return true;
  }

  synchronized void forget(LeaseRecord lease) {
    if (leases.remove(lease.id()) != null) {
      leasedBytes -= lease.block().size();
    }
  }

  /** Marks the session ended and hands over its leases; null if it had already ended. */
  synchronized List<LeaseRecord> end() {
    if (ended) {
      return null;
    }
    ended = true;
    List<LeaseRecord> held = new ArrayList<>(leases.values());
    leases.clear();
    leasedBytes = 0;
    return held;
  }

  @Override
  public String toString() {
    return "session " + id.substring(0, 8) + " (" + clientName + ")";
  }
}
