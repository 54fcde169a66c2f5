package io.gpumemd.server.pool;

import java.util.List;
import java.util.Map;

/**
 * A pool written down whole ({@link DevicePool#snapshot}), to rebuild the same pool in another
 * process ({@link DevicePool#restore}): its segments and their blocks, the idle order, the
 * counters and the figures kept beside them. What it leaves out is recomputed by the restore:
 * the budget's reserved bytes, the leased figures, the cached bytes, the free index.
 *
 * <p>Plain values, immutable once built; the memory itself travels as one descriptor per
 * segment, which each {@link SegmentSnapshot} names by its index among the descriptors the
 * snapshot's {@link SegmentFdSink} took.
 *
 * @param device the device ordinal
 * @param deviceUuid the device's UUID ("" when unnamed)
 * @param nextSegmentId the id the next new segment gets
 * @param segments live segments, then segments awaiting unmaps
 * @param idleLru ids of the idle segments, least recently used first
 * @param counters the pool's counters by their {@link PoolMetric#protoField} name, except those
 *     kept in {@link ClientCache} and {@link Sharing}
 * @param retentionCapBytes the retention cap in force
 * @param retentionCapSetAtRuntime whether SetRetentionCap set it (it then outranks the flag)
 * @param peakLeasedBytes the peak of leased bytes
 * @param limitBytes the pool's budget
 * @param clientCache the client cache tier's books
 * @param sharing the sharing figures
 */
public record PoolSnapshot(int device, String deviceUuid, long nextSegmentId, List<SegmentSnapshot> segments,
    List<Long> idleLru, Map<String, Long> counters, long retentionCapBytes, boolean retentionCapSetAtRuntime,
    long peakLeasedBytes, long limitBytes, ClientCache clientCache, Sharing sharing) {

  public PoolSnapshot {
    segments = List.copyOf(segments);
    idleLru = List.copyOf(idleLru);
    counters = Map.copyOf(counters);
  }

  /** This snapshot with other segments (a take-over's changes carry only those changed). */
  public PoolSnapshot withSegments(List<SegmentSnapshot> others) {
    return new PoolSnapshot(device, deviceUuid, nextSegmentId, others, idleLru, counters, retentionCapBytes,
        retentionCapSetAtRuntime, peakLeasedBytes, limitBytes, clientCache, sharing);
  }

  /** A segment's place in its life: live, or evicted and waiting for its holders' unmaps. */
  public enum Lifecycle { LIVE, AWAITING_UNMAP }

  /** A block's state; a block awaiting a completion event cannot be written down. */
  public enum BlockKind { FREE, LEASED, CLIENT_CACHED }

  /**
   * One segment.
   *
   * @param descriptorIndex its descriptor's index among those the sink took
   * @param state its lifecycle; null for one this daemon does not know (refused by the restore)
   * @param blocks its blocks in offset order (none when awaiting unmaps)
   * @param mappers holders that may have mapped it
   */
  public record SegmentSnapshot(long id, String ownerKey, long bytes, boolean small, int descriptorIndex,
      Lifecycle state, List<BlockSnapshot> blocks, List<String> mappers) {
    public SegmentSnapshot {
      blocks = List.copyOf(blocks);
      mappers = List.copyOf(mappers);
    }
  }

  /**
   * One block of a live segment.
   *
   * @param state null for a state this daemon does not know (refused by the restore)
   * @param cachedBy the holder that caches it when CLIENT_CACHED, else ""
   */
  public record BlockSnapshot(long offset, long size, BlockKind state, String cachedBy) {}

  /** The client cache tier's books: bytes cached by holder, holders asked to return, reported figures. */
  public record ClientCache(Map<String, Long> bytesByHolder, List<String> returnAsked, long reportedHits,
      long reportedReturns) {
    public ClientCache {
      bytesByHolder = Map.copyOf(bytesByHolder);
      returnAsked = List.copyOf(returnAsked);
    }
  }

  /** The sharing figures ({@link SharingCounters}). */
  public record Sharing(long shares, long liveHolds, long sharedBlocks, long publishedObjects, long publishedBytes) {}
}
