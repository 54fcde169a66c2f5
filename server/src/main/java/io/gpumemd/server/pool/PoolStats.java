package io.gpumemd.server.pool;

import java.util.Arrays;
import java.util.StringJoiner;

/**
 * Immutable snapshot of one device pool's figures, one value per {@link PoolMetric}, taken under
 * the pool lock. Thread-safe.
 *
 * <p>Exact at the snapshot, and in agreement with each other: every byte figure and gauge of
 * blocks and segments ({@code reserved = leased + client_cached + cached + remainder +
 * awaiting_event + awaiting_unmap}, active leases, segments, …), every counter that changes
 * under the lock (hits, misses, returns, evictions, alloc_retries, ooms, backend allocations and
 * frees, scrubbed bytes, attaches), and published bytes. Not exact: the figures that change
 * without the lock ({@link SharingCounters}, {@link ClientCacheBooks#reported}): {@code shares},
 * {@code client_cache_hits} and {@code client_cache_returns} may miss calls made during the
 * snapshot (and a client's report of hits may be in while its returns are not yet); {@code
 * live_holds}, {@code shared_blocks} and {@code published_objects} may too, but stay within the
 * bounds {@link PoolInvariants} checks (see {@link SharingCounters}). A snapshot of a pool at
 * rest is exact throughout.
 */
public final class PoolStats {
  private final int device;
  private final long[] values;

  PoolStats(int device, long[] values) {
    assert values.length == PoolMetric.values().length;
    this.device = device;
    this.values = values;
  }

  /** Takes the figures of a pool, whose lock the caller holds; the retention cap is {@link Eviction}'s. */
  static PoolStats snapshot(PoolCore core, long retentionCapBytes) {
    assert core.lock.isHeldByCurrentThread();
    long[] v = core.counters.snapshot();
    core.carver.report(v);
    core.budget.report(v);
    core.clientCache.report(v);
    core.holders.report(v);
    core.events.report(v);
    core.sharing.report(v);
    v[PoolMetric.REMAINDER_BYTES.ordinal()] = core.remainderBytes();
    v[PoolMetric.RETENTION_CAP_BYTES.ordinal()] = retentionCapBytes;
    v[PoolMetric.CAPACITY_BYTES.ordinal()] = core.device.capacityBytes();
    return new PoolStats(core.device.ordinal(), v);
  }

  public int device() {
    return device;
  }

  public long get(PoolMetric metric) {
    return values[metric.ordinal()];
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof PoolStats other && device == other.device && Arrays.equals(values, other.values);
  }

  @Override
  public int hashCode() {
    return 31 * device + Arrays.hashCode(values);
  }

  @Override
  public String toString() {
    StringJoiner out = new StringJoiner(", ", "PoolStats[device=" + device + ", ", "]");
    for (PoolMetric m : PoolMetric.values()) {
      out.add(m.protoField() + "=" + values[m.ordinal()]);
    }
    return out.toString();
  }
}
