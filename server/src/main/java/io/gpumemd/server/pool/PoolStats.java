package io.gpumemd.server.pool;

/**
 * Immutable snapshot of one device pool's counters and gauges, taken under the pool lock so
 * that the figures agree with each other. Definitions follow the design's {@code DeviceStats}.
 */
public record PoolStats(
    int device,
    long hits,
    long misses,
    long returns,
    long evictions,
    long allocRetries,
    long ooms,
    long leasedBytes,
    long cachedBytes,
    long reservedBytes,
    long peakLeasedBytes,
    long activeLeases,
    long cachedBlocks,
    long segments,
    long retentionCapBytes,
    long capacityBytes,
    long limitBytes,
    long remainderBytes,
    long backendAllocs,
    long backendFrees,
    long segmentsAwaitingUnmap,
    long awaitingUnmapBytes,
    long blocksAwaitingEvent,
    long awaitingEventBytes) {

  /** The pool's state for messages: {@code (leased=…, cached=…, …, limit=…)}. */
  public String describe() {
    return "leased=" + leasedBytes + ", cached=" + cachedBytes + ", remainder=" + remainderBytes
        + ", awaiting_unmap=" + awaitingUnmapBytes + ", awaiting_event=" + awaitingEventBytes
        + ", limit=" + limitBytes;
  }
}
