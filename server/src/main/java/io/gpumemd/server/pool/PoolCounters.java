package io.gpumemd.server.pool;

/**
 * The event counters of one pool that change under its lock ({@link PoolMetric.Kind#COUNTER}:
 * hits, misses, returns, evictions, …), indexed by metric; the counters that change without it
 * are kept apart ({@link SharingCounters}, {@link ClientCacheBooks#reported}). Guarded by the
 * owning pool's lock ({@link PoolCore#lock}); {@link #snapshot} copies them into the values of a {@link
 * PoolStats}. A counter never goes negative: {@link #add} saturates at {@link Long#MAX_VALUE}.
 */
final class PoolCounters {
  private final long[] counts = new long[PoolMetric.values().length];

  void increment(PoolMetric counter) {
    assert counter.kind() == PoolMetric.Kind.COUNTER : counter;
    counts[counter.ordinal()]++;
  }

  /** Adds {@code n >= 0}; the sum saturates at {@link Long#MAX_VALUE} instead of wrapping. */
  void add(PoolMetric counter, long n) {
    assert counter.kind() == PoolMetric.Kind.COUNTER && n >= 0 : counter + " += " + n;
    long sum = counts[counter.ordinal()] + n;
    // Both operands are non-negative, so a wrapped sum is exactly a negative one.
    counts[counter.ordinal()] = sum < 0 ? Long.MAX_VALUE : sum;
  }

  long get(PoolMetric counter) {
    return counts[counter.ordinal()];
  }

  /** A copy of every counter, with the gauges zero, for the pool to fill in. */
  long[] snapshot() {
    return counts.clone();
  }
}
