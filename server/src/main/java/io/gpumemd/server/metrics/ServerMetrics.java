package io.gpumemd.server.metrics;

import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolStats;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.Timer;
import io.gpumemd.server.offload.HostStore;
import io.micrometer.core.instrument.binder.MeterBinder;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.function.IntSupplier;

/**
 * The daemon's meters: one per {@link PoolMetric} and device (tagged {@code device}, the same
 * figures as {@code Admin.GetStats}), the live sessions, the device memory in use outside the
 * daemon's books where the backend can tell ({@code gpumemd_device_unaccounted_bytes}), and a lease-latency timer with
 * percentiles per device and result.
 *
 * <p>Pool meters read a snapshot that {@link #refresh()} takes once per scrape (one {@link
 * DevicePool#stats()} per pool, not one per meter), so every figure of a scrape comes from the
 * same instant and the pool hot path pays nothing for them; only {@link #recordLease} runs per
 * lease, and it only writes the figure into a ring ({@link LeaseLatencies}) that housekeeping
 * and each scrape record into the timers ({@link #recordLeases}). Meter names: see {@link
 * #meterName}; Prometheus-style {@code gpumemd_pool_hits_total}. A counter never reads negative
 * (the pool's counters saturate, clients' reports included), and a meter that fails anyway is
 * left out of the scrape by {@link IsolatingPrometheusRegistry}.
 *
 * <p>Thread-safe: the snapshot array is replaced as a whole and read through a volatile field;
 * lease figures pass through {@link LeaseLatencies}, which any number of threads write.
 */
public final class ServerMetrics implements MeterBinder {
  private final DevicePools pools;
  private final IntSupplier sessions;
  private final MemoryBackend backend;
  private volatile PoolStats[] latest;
  private LeaseLatencies leaseLatencies;
  private Timer sleepTimer;
  private Timer wakeTimer;

  /** Binds to {@code registry} at once, so that {@link #recordLease} may be called. */
  public ServerMetrics(MeterRegistry registry, DevicePools pools, IntSupplier sessions, MemoryBackend backend) {
    this.pools = pools;
    this.sessions = sessions;
    this.backend = backend;
    snapshot();
    bindTo(registry);
  }

  /**
   * Records the leases served so far and takes one snapshot of every pool for the meters to
   * read; call before each scrape.
   */
  public void refresh() {
    recordLeases();
    snapshot();
  }

  private void snapshot() {
    PoolStats[] stats = new PoolStats[pools.size()];
    for (DevicePool pool : pools.all()) {
      stats[pool.device().ordinal()] = pool.stats();
    }
    latest = stats;
  }

  /**
   * The meter name of a pool figure: {@code gpumemd.pool.<metric>}, except the backend's and
   * the clients' own figures, which are named for whose they are ({@code gpumemd.backend.allocs},
   * {@code gpumemd.client.cache.hits}).
   */
  static String meterName(PoolMetric metric) {
    String dotted = metric.protoField().replace('_', '.');
    return dotted.startsWith("backend.") || dotted.startsWith("client.") ? "gpumemd." + dotted : "gpumemd.pool." + dotted;
  }

  @Override
  public void bindTo(MeterRegistry registry) {
    Timer[][] timers = new Timer[pools.size()][2];
    for (DevicePool pool : pools.all()) {
      int device = pool.device().ordinal();
      Tags tags = Tags.of("device", Integer.toString(device));
      for (PoolMetric metric : PoolMetric.values()) {
        String name = meterName(metric);
        if (metric.kind() == PoolMetric.Kind.COUNTER) {
          FunctionCounter.builder(name, this, m -> m.latest[device].get(metric))
              .description(metric.description()).tags(tags)
              .baseUnit(metric.isBytes() ? "bytes" : null).register(registry);
        } else {
          Gauge.builder(name, this, m -> m.latest[device].get(metric))
              .description(metric.description()).tags(tags)
              .baseUnit(metric.isBytes() ? "bytes" : null).register(registry);
        }
      }
      if (backend.bytesOutsideBooks(device) >= 0) {
        // Read from the driver at each scrape (a microsecond call): memory the budget cannot see.
        Gauge.builder("gpumemd.device.unaccounted", backend, b -> b.bytesOutsideBooks(device))
            .description("device memory in use that the daemon's segments do not explain: other processes, "
                + "driver contexts, released segments still mapped by a client")
            .tags(tags).baseUnit("bytes").register(registry);
      }
      for (int hit = 0; hit < 2; hit++) {
        timers[device][hit] = Timer.builder("gpumemd.lease.latency")
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
    leaseLatencies = new LeaseLatencies(timers);
    sleepTimer = Timer.builder("gpumemd.sleep.duration").description("time to put a session's leases to sleep "
        + "(Allocator.Sleep answered), contents copied to host memory included").register(registry);
    wakeTimer = Timer.builder("gpumemd.wake.duration").description("time to wake a session's sleeping leases "
        + "(Allocator.Wake answered), contents copied back included").register(registry);
    Gauge.builder("gpumemd.sessions", sessions, IntSupplier::getAsInt)
        .description("live sessions").register(registry);
  }

  /**
   * Binds the figures of the host store that keeps sleeping leases' contents: bytes held and
   * the bound ({@code --offload-max-bytes}), and the ranges parked and restored.
   */
  public static void bindHostStore(MeterRegistry registry, HostStore store) {
    Gauge.builder("gpumemd.offload.held", store, HostStore::heldBytes).baseUnit("bytes")
        .description("bytes of sleeping leases' contents kept in host memory").register(registry);
    Gauge.builder("gpumemd.offload.spare", store, HostStore::spareBytes).baseUnit("bytes")
        .description("host memory kept from dropped contents for the next sleep (within the bound, freed after 30 s "
            + "unused)").register(registry);
    Gauge.builder("gpumemd.offload.max", store, HostStore::maxBytes).baseUnit("bytes")
        .description("bound on the contents kept in host memory (--offload-max-bytes)").register(registry);
    FunctionCounter.builder("gpumemd.offload.parks", store, HostStore::parks)
        .description("ranges of device memory copied to host memory").register(registry);
    FunctionCounter.builder("gpumemd.offload.restores", store, HostStore::restores)
        .description("ranges copied back from host memory to device memory").register(registry);
  }

  /** Records one Sleep answered. */
  public void recordSleep(long nanos) {
    sleepTimer.record(nanos, TimeUnit.NANOSECONDS);
  }

  /** Records one Wake answered. */
  public void recordWake(long nanos) {
    wakeTimer.record(nanos, TimeUnit.NANOSECONDS);
  }

  /** Records one served lease: into the timer at the next {@link #recordLeases} (see {@link LeaseLatencies}). */
  public void recordLease(int device, boolean hit, long nanos) {
    leaseLatencies.record(device, hit, nanos);
  }

  /**
   * Records the leases served since the last call into the lease-latency timers: every
   * housekeeping round, and before each scrape ({@link #refresh}).
   */
  public void recordLeases() {
    leaseLatencies.drain();
  }
}
