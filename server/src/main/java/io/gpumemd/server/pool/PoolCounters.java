package io.gpumemd.server.pool;

/**
 * The event counters of one pool ({@link PoolMetric.Kind#COUNTER}: hits, misses, returns, …),
 * indexed by metric. Guarded by the owning {@link DevicePool}'s lock; {@link #snapshot} copies
 * them into the values of a {@link PoolStats}.
 */
final class PoolCounters {
  private final long[] counts = new long[PoolMetric.values().length];

  void increment(PoolMetric counter) {
    assert counter.kind() == PoolMetric.Kind.COUNTER : counter;
    counts[counter.ordinal()]++;
  }

  void add(PoolMetric counter, long n) {
    assert counter.kind() == PoolMetric.Kind.COUNTER : counter;
    counts[counter.ordinal()] += n;
  }

  long get(PoolMetric counter) {
    return counts[counter.ordinal()];
  }

  /** A copy of every counter, with the gauges zero, for the pool to fill in. */
  long[] snapshot() {
    return counts.clone();
  }
}
