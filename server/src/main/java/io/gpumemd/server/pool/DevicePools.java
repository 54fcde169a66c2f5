package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.server.error.InvalidRequestException;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * The pools of every device, indexed by ordinal. Immutable after construction; thread-safe.
 * Segment ids carry their device in the top 16 bits, so a segment id alone finds its pool.
 */
public final class DevicePools implements AutoCloseable {
  private final List<DevicePool> pools;

  public DevicePools(List<DevicePool> pools) {
    this.pools = List.copyOf(pools);
  }

  /** First segment id of a device's pool ({@link SegmentIds}). */
  public static long segmentIdBase(int device) {
    return SegmentIds.base(device);
  }

  /** Device a segment id belongs to. */
  public static int deviceOfSegment(long segmentId) {
    return SegmentIds.deviceOf(segmentId);
  }

  /**
   * The pool of a device.
   *
   * @throws InvalidRequestException for an unknown ordinal
   */
  public DevicePool get(int device) {
    if (device < 0 || device >= pools.size()) {
      throw InvalidRequestException.of("device", device,
          pools.size() == 1 ? "0, the only device" : "0.." + (pools.size() - 1));
    }
    return pools.get(device);
  }

  /** The pool owning a segment, or null for an id no pool could have issued. */
  public DevicePool ofSegment(long segmentId) {
    int device = deviceOfSegment(segmentId);
    return device >= 0 && device < pools.size() ? pools.get(device) : null;
  }

  /**
   * Sets the retention cap of the given pools: all of them, or none when the cap exceeds one's
   * budget (the budget already bounds the cache, so such a cap is a mistake to report).
   *
   * @return bytes evicted, summed over the pools
   * @throws InvalidRequestException for a negative cap or one above a pool's budget
   */
  public long setRetentionCap(List<DevicePool> targets, long capBytes) {
    for (DevicePool pool : targets) {
      if (capBytes > pool.limitBytes()) {
        throw InvalidRequestException.of("cap_bytes", capBytes, "at most " + pool.limitBytes()
            + ", the budget of device " + pool.device().ordinal() + " ("
            + Sizes.format(pool.limitBytes()) + ")");
      }
    }
    long evicted = 0;
    for (DevicePool pool : targets) {
      evicted += pool.setRetentionCap(capBytes);
    }
    return evicted;
  }

  /** The oversize rule of the pools: one flag ({@code --max-oversize-bytes}) for every device. */
  public long maxOversizeBytes() {
    return pools.isEmpty() ? SizeClasses.DEFAULT_MAX_OVERSIZE : pools.get(0).maxOversizeBytes();
  }

  public List<DevicePool> all() {
    return pools;
  }

  public int size() {
    return pools.size();
  }

  // ---------------------------------------------------------------------- snapshot, restore

  /**
   * Why pools with these budgets (by device ordinal) could not be restored from these pools'
   * snapshots, or null ({@link DevicePool#restoreRefusal}).
   */
  public String restoreRefusal(List<Long> otherLimitBytes) {
    if (otherLimitBytes.size() != pools.size()) {
      return "this daemon has " + pools.size() + " devices, the new one " + otherLimitBytes.size()
          + " (expected: the same devices)";
    }
    for (int d = 0; d < pools.size(); d++) {
      String refusal = pools.get(d).restoreRefusal(otherLimitBytes.get(d));
      if (refusal != null) {
        return refusal;
      }
    }
    return null;
  }

  /**
   * Every pool written down, by device ordinal ({@link DevicePool#snapshot}); one sink takes the
   * descriptors of all of them.
   *
   * @throws SnapshotRefusedException when any pool cannot be written down (descriptors already in
   *     the sink stay the sink's)
   */
  public List<PoolSnapshot> snapshots(SegmentFdSink sink) throws SnapshotRefusedException {
    List<PoolSnapshot> snapshots = new java.util.ArrayList<>(pools.size());
    for (DevicePool pool : pools) {
      snapshots.add(pool.snapshot(sink));
    }
    return snapshots;
  }

  /**
   * Rebuilds pools written down in another process in these, which must be new: snapshot {@code
   * d} in pool {@code d}. Takes every segment the snapshots name, whatever happens: on a
   * refusal the pools restored so far are handed back (their segments relinquished, not freed)
   * and the segments of the devices not reached are given up.
   */
  public void restore(List<PoolSnapshot> snapshots, IncomingSegments segments) throws SnapshotRefusedException {
    segments.keepOnlyNamed(snapshots);
    int done = 0;
    try {
      if (snapshots.size() != pools.size()) {
        throw new SnapshotRefusedException("the running daemon has " + snapshots.size() + " devices, this one "
            + pools.size() + " (expected: the same devices)");
      }
      for (; done < pools.size(); done++) {
        pools.get(done).restore(snapshots.get(done), segments);
      }
    } catch (SnapshotRefusedException | RuntimeException e) {
      for (int d = 0; d < done; d++) {
        pools.get(d).relinquish();
      }
      // The failed device gave up its own; those after it were never taken.
      for (int d = done + 1; d < snapshots.size(); d++) {
        for (var s : snapshots.get(d).segments()) {
          segments.discard(s.descriptorIndex());
        }
      }
      throw e;
    }
  }

  /** Every pool's {@link DevicePool#segmentsAhead}, by device ordinal. */
  public List<SegmentAhead> segmentsAhead() {
    List<SegmentAhead> ahead = new java.util.ArrayList<>();
    for (DevicePool pool : pools) {
      ahead.addAll(pool.segmentsAhead());
    }
    return ahead;
  }

  /** Ends every pool once another process serves it ({@link DevicePool#relinquish}). Idempotent. */
  public void relinquish() {
    pools.forEach(DevicePool::relinquish);
  }

  @Override
  public void close() {
    pools.forEach(DevicePool::close);
  }

  /** Segments a holder may have mapped, over all devices. */
  public int mappedSegments(String holder) {
    int total = 0;
    for (DevicePool pool : all()) {
      total += pool.mappedSegments(holder);
    }
    return total;
  }

  /** Bytes of evicted segments that processes of the tenant may still map, over all devices. */
  public long pinnedBytes(String tenant) {
    long total = 0;
    for (DevicePool pool : all()) {
      total += pool.pinnedBytes(tenant);
    }
    return total;
  }

  /** The processes that may map a segment of any device because they were sent its descriptor (keys). */
  public Set<String> descriptorHolders() {
    Set<String> keys = new HashSet<>();
    for (DevicePool pool : all()) {
      keys.addAll(pool.descriptorHolders());
    }
    return keys;
  }

  /** A holder ended on every device. */
  public void holderEnded(String holder) {
    for (DevicePool pool : all()) {
      pool.holderEnded(holder);
    }
  }
}
