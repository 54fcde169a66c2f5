package io.gpumemd.server.metrics;

import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.session.SessionRegistry;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.Timer;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.function.ToDoubleFunction;

/**
 * Publishes the pools' counters and gauges as Micrometer meters tagged {@code device}, with
 * the same figures as {@code Admin.GetStats}, plus a lease-latency timer with percentiles.
 *
 * <p>Counters and gauges are read from {@link DevicePool#stats()} at scrape time, so the pool
 * hot path pays nothing for them; only {@link #recordLease} runs per lease. Thread-safe.
 */
public final class ServerMetrics {
  private final Timer[][] leaseTimers;

  public ServerMetrics(MeterRegistry registry, DevicePools pools, SessionRegistry sessions) {
    leaseTimers = new Timer[pools.size()][2];
    for (DevicePool pool : pools.all()) {
      int device = pool.device().ordinal();
      Tags tags = Tags.of("device", Integer.toString(device));
      counter(registry, "gpumemd.pool.hits", "leases served from cached memory", tags, pool, PoolStats::hits);
      counter(registry, "gpumemd.pool.misses", "leases that needed a new backend allocation", tags, pool, PoolStats::misses);
      counter(registry, "gpumemd.pool.returns", "released blocks that went back into the cache", tags, pool, PoolStats::returns);
      counter(registry, "gpumemd.pool.evictions", "cached segments given back to the backend", tags, pool, PoolStats::evictions);
      counter(registry, "gpumemd.pool.alloc.retries", "misses that evicted cached memory and retried", tags, pool, PoolStats::allocRetries);
      counter(registry, "gpumemd.pool.ooms", "leases refused for lack of memory or budget", tags, pool, PoolStats::ooms);
      counter(registry, "gpumemd.backend.allocs", "backend segment allocations", tags, pool, PoolStats::backendAllocs);
      counter(registry, "gpumemd.backend.frees", "backend segment frees", tags, pool, PoolStats::backendFrees);
      gauge(registry, "gpumemd.pool.leased.bytes", "bytes in leased blocks", tags, pool, PoolStats::leasedBytes);
      gauge(registry, "gpumemd.pool.cached.bytes", "bytes in wholly free cached segments", tags, pool, PoolStats::cachedBytes);
      gauge(registry, "gpumemd.pool.reserved.bytes", "bytes the backend holds for the pool", tags, pool, PoolStats::reservedBytes);
      gauge(registry, "gpumemd.pool.remainder.bytes", "free bytes in segments that also hold leases", tags, pool, PoolStats::remainderBytes);
      gauge(registry, "gpumemd.pool.peak.leased.bytes", "highest leased bytes since start", tags, pool, PoolStats::peakLeasedBytes);
      gauge(registry, "gpumemd.pool.active.leases", "live leases", tags, pool, PoolStats::activeLeases);
      gauge(registry, "gpumemd.pool.cached.blocks", "free blocks in the cache", tags, pool, PoolStats::cachedBlocks);
      gauge(registry, "gpumemd.pool.segments", "live backend segments", tags, pool, PoolStats::segments);
      gauge(registry, "gpumemd.pool.retention.cap.bytes", "cap on cached bytes", tags, pool, PoolStats::retentionCapBytes);
      gauge(registry, "gpumemd.pool.capacity.bytes", "total memory of the device", tags, pool, PoolStats::capacityBytes);
      gauge(registry, "gpumemd.pool.limit.bytes", "the pool budget", tags, pool, PoolStats::limitBytes);
      gauge(registry, "gpumemd.pool.segments.awaiting.unmap", "evicted segments waiting for clients to unmap", tags, pool, PoolStats::segmentsAwaitingUnmap);
      gauge(registry, "gpumemd.pool.blocks.awaiting.event", "released blocks waiting for their CUDA event", tags, pool, PoolStats::blocksAwaitingEvent);
      for (int hit = 0; hit < 2; hit++) {
        leaseTimers[device][hit] = Timer.builder("gpumemd.lease.latency")
            .description("server-side time to serve a lease")
            .tags(tags).tag("result", hit == 1 ? "hit" : "miss")
            // Client-side percentiles (a Prometheus summary): what an operator reads at a
            // glance; the _count and _sum series still give rates and means.
            .publishPercentiles(0.5, 0.9, 0.99, 0.999)
            .percentilePrecision(2)
            .distributionStatisticExpiry(Duration.ofMinutes(1))
            .register(registry);
      }
    }
    Gauge.builder("gpumemd.sessions", sessions, SessionRegistry::sessionCount)
        .description("live sessions").register(registry);
  }

  private static void counter(MeterRegistry registry, String name, String help, Tags tags,
      DevicePool pool, ToDoubleFunction<PoolStats> field) {
    FunctionCounter.builder(name, pool, p -> field.applyAsDouble(p.stats()))
        .description(help).tags(tags).register(registry);
  }

  private static void gauge(MeterRegistry registry, String name, String help, Tags tags,
      DevicePool pool, ToDoubleFunction<PoolStats> field) {
    Gauge.builder(name, pool, p -> field.applyAsDouble(p.stats()))
        .description(help).tags(tags).baseUnit(name.endsWith(".bytes") ? "bytes" : null).register(registry);
  }

  /** Records one served lease. */
  public void recordLease(int device, boolean hit, long nanos) {
    leaseTimers[device][hit ? 1 : 0].record(nanos, TimeUnit.NANOSECONDS);
  }
}
