package io.gpumemd.server.session;

import io.gpumemd.server.auth.Caller;
import java.util.List;

/**
 * The session layer written down whole ({@link SessionRegistry#snapshot}), to rebuild it in
 * another process over pools restored from their own snapshots ({@link SessionRegistry#restore}):
 * sessions, lease records, shared blocks, share tokens, published names, the lease sequence and
 * the churn window. Instants are ages from the moment it was taken, so that it means the same to
 * a process with another clock. Shared blocks are referred to by their index in {@link
 * #sharedBlocks} (-1: none); blocks of the pools by device, segment id and offset.
 *
 * <p>Plain values, immutable once built.
 */
public record SessionsSnapshot(long leaseSequence, List<SessionSnapshot> sessions, List<LeaseSnapshot> leases,
    List<SharedBlockSnapshot> sharedBlocks, List<TokenSnapshot> tokens, List<ObjectSnapshot> objects,
    Churn churn) {

  public SessionsSnapshot {
    sessions = List.copyOf(sessions);
    leases = List.copyOf(leases);
    sharedBlocks = List.copyOf(sharedBlocks);
    tokens = List.copyOf(tokens);
    objects = List.copyOf(objects);
  }

  /** This snapshot with other leases (a take-over's changes carry only those changed). */
  public SessionsSnapshot withLeases(List<LeaseSnapshot> others) {
    return new SessionsSnapshot(leaseSequence, sessions, others, sharedBlocks, tokens, objects, churn);
  }

  /**
   * One session. Its segment owner is kept as three values, checked when the session is rebuilt.
   *
   * @param detachedAgeNanos since its stream went, when it had one and it is gone; else 0
   */
  public record SessionSnapshot(String id, Caller owner, String segmentOwnerKey, int segmentOwnerUid,
      int segmentOwnerGid, String clientName, int ttlSeconds, long openedAgeNanos, long lastSeenAgeNanos,
      boolean hadStream, boolean streamAttached, long detachedAgeNanos, long grantedCacheBytes, long cacheAllowance,
      boolean cacheReturnOverdue, List<ClientCounters> reportedCounters, long appliedMessages) {
    public SessionSnapshot {
      reportedCounters = List.copyOf(reportedCounters);
    }
  }

  /** A client's reported cache figures for one device. */
  public record ClientCounters(int device, long hits, long returns) {}

  /**
   * One lease or hold, on the block at {@code device}/{@code segmentId}/{@code blockOffset}.
   *
   * @param sharedBlock its shared block's index, or -1
   */
  public record LeaseSnapshot(String id, String sessionId, int device, long segmentId, long blockOffset,
      long blockSize, long requestedBytes, String tag, long grantedAgeNanos, long sequence, boolean poolHit,
      boolean attached, boolean readOnly, boolean clientCached, boolean leakReported, int sharedBlock) {
    /** This lease as written down {@code nanos} later: only its age differs. */
    public LeaseSnapshot olderBy(long nanos) {
      return new LeaseSnapshot(id, sessionId, device, segmentId, blockOffset, blockSize, requestedBytes, tag,
          grantedAgeNanos + nanos, sequence, poolHit, attached, readOnly, clientCached, leakReported, sharedBlock);
    }
  }

  /** A block shared by leases, holds, tokens and names; lists the ids of the records on it. */
  public record SharedBlockSnapshot(int device, long segmentId, long blockOffset, long blockSize,
      long requestedBytes, String leasedByTenant, String leasedBySessionId, List<String> recordIds,
      List<String> names, int tokenCount) {
    public SharedBlockSnapshot {
      recordIds = List.copyOf(recordIds);
      names = List.copyOf(names);
    }
  }

  /** A share token on a shared block. */
  public record TokenSnapshot(String token, String id, String tenant, int sharedBlock, boolean readOnly,
      int maxAttaches, int attaches, long createdAgeNanos, long expiresInNanos, String sessionId, String leaseId,
      String clientName, boolean dead) {}

  /** A published name on a shared block. */
  public record ObjectSnapshot(String tenant, String name, int sharedBlock, boolean readOnly,
      long publishedAgeNanos, String publishedBy, long lookups) {}

  /** The session churn window's figures ({@link SessionChurn}). */
  public record Churn(long windowAgeNanos, long opened, long ended, long endedHolding, long releasedLeases,
      long releasedBytes, long refusedTotal, long refusedPerTenant, long refusedRate, int holdingToldSingly) {}

  /**
   * What a {@link SessionRegistry#restore} rebuilt, for the caller's log line.
   *
   * @param cappedTtls sessions whose TTL this daemon's maximum capped
   * @param cappedAllowances sessions whose client cache grant this daemon's cap capped
   * @param overQuota sessions and tenants whose restored usage is over this daemon's quotas
   * @param overQuotaNamed the first few of them, with their usage
   */
  public record Restored(int sessions, int leases, int sharedBlocks, int tokens, int objects, long lastSequence,
      int cappedTtls, int cappedAllowances, int overQuota, List<String> overQuotaNamed) {
    public Restored {
      overQuotaNamed = List.copyOf(overQuotaNamed);
    }
  }
}
