package io.gpumemd.server.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.InMemoryBackend;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.pool.RecordingHolders;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * Every pool figure becomes one meter per device, and a scrape reads one snapshot: between
 * refreshes the meters keep showing the same instant, so the figures of one scrape agree.
 */
class ServerMetricsTest {
  private final InMemoryBackend backend = new InMemoryBackend(2, 64L << 20, false);
  private final DevicePools pools = new DevicePools(List.of(pool(0), pool(1)));
  private final SimpleMeterRegistry registry = new SimpleMeterRegistry();

  private DevicePool pool(int device) {
    return new DevicePool(backend.devices().get(device), backend, new PoolSettings(64L << 20, 64L << 20, 20L << 20),
        new RecordingHolders(), DevicePools.segmentIdBase(device), Ticker.system());
  }

  private double gauge(String name, int device) {
    return registry.get(name).tag("device", Integer.toString(device)).gauge().value();
  }

  private double counter(String name, int device) {
    return registry.get(name).tag("device", Integer.toString(device)).functionCounter().count();
  }

  @Test
  void everyPoolMetric_isOneMeterPerDevice() {
    new ServerMetrics(registry, pools, () -> 3, backend);
    for (PoolMetric metric : PoolMetric.values()) {
      for (int device = 0; device < 2; device++) {
        assertEquals(1, registry.find(ServerMetrics.meterName(metric)).tag("device", Integer.toString(device)).meters().size(),
            metric + " on device " + device);
      }
    }
    assertEquals("gpumemd.pool.alloc.retries", ServerMetrics.meterName(PoolMetric.ALLOC_RETRIES));
    assertEquals("gpumemd.backend.allocs", ServerMetrics.meterName(PoolMetric.BACKEND_ALLOCS));
    assertEquals("gpumemd.pool.awaiting.unmap.bytes", ServerMetrics.meterName(PoolMetric.AWAITING_UNMAP_BYTES));
    assertEquals("gpumemd.client.cache.hits", ServerMetrics.meterName(PoolMetric.CLIENT_CACHE_HITS));
    assertEquals("gpumemd.client.cached.bytes", ServerMetrics.meterName(PoolMetric.CLIENT_CACHED_BYTES));
    assertEquals(3, registry.get("gpumemd.sessions").gauge().value());
  }

  @Test
  void meters_showTheSnapshotOfTheLastRefresh() {
    ServerMetrics metrics = new ServerMetrics(registry, pools, () -> 0, backend);
    pools.get(1).lease(4 << 20, false, "holder", SegmentOwner.DAEMON);

    // Not refreshed yet: the lease happened after the snapshot.
    assertEquals(0, gauge("gpumemd.pool.leased.bytes", 1));
    assertEquals(0, counter("gpumemd.pool.misses", 1));

    metrics.refresh();
    assertEquals(4 << 20, gauge("gpumemd.pool.leased.bytes", 1));
    assertEquals(1, counter("gpumemd.pool.misses", 1));
    assertEquals(1, gauge("gpumemd.pool.active.leases", 1));
    assertEquals(0, gauge("gpumemd.pool.leased.bytes", 0));
    pools.close();
  }
}
