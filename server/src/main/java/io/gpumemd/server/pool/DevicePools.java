package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.server.error.InvalidRequestException;
import java.util.List;

/**
 * The pools of every device, indexed by ordinal. Immutable after construction; thread-safe.
 * Segment ids carry their device in the top 16 bits, so a segment id alone finds its pool.
 */
public final class DevicePools implements AutoCloseable {
  private static final int DEVICE_SHIFT = 48;

  private final List<DevicePool> pools;

  public DevicePools(List<DevicePool> pools) {
    this.pools = List.copyOf(pools);
  }

  /** First segment id of a device's pool. */
  public static long segmentIdBase(int device) {
    return ((long) device << DEVICE_SHIFT) + 1;
  }

  /** Device a segment id belongs to. */
  public static int deviceOfSegment(long segmentId) {
    return (int) (segmentId >>> DEVICE_SHIFT);
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
}
