package io.gpumemd.server.config;

import io.gpumemd.server.offload.HostStore;
import java.util.List;
import java.util.Map;

/**
 * Each device pool's budget and caching policy; part of {@link ServerConfig}.
 *
 * @param deviceLimitFraction device budget as a fraction of device memory ({@code
 *     --device-limit-fraction})
 * @param deviceLimitBytes device budget in bytes, or 0 to use the fraction ({@code
 *     --device-limit-bytes})
 * @param retentionCapBytes cap on cached bytes per device, or -1 for "the device budget"
 *     ({@code --retention-cap-bytes})
 * @param maxOversizeBytes most a cached block may exceed a large request and still serve it
 *     ({@code --max-oversize-bytes})
 * @param unmapWaitMillis how long a lease may wait for clients to unmap evicted segments, and a
 *     sleep for the other holders of its shared blocks
 *     ({@code --unmap-wait-ms})
 * @param maxPublishedBytes bytes of published objects per device, or -1 for "the device budget"
 *     ({@code --max-published-bytes})
 * @param offloadMaxBytes bytes of sleeping leases' and parked objects' contents kept in host memory, all devices
 *     together ({@code --offload-max-bytes}; default {@link HostStore#defaultMaxBytes})
 * @param parkIdleObjects before a lease is refused for lack of budget, idle published objects
 *     are parked in host memory, least recently looked up first ({@code --park-idle-objects})
 */
public record PoolConfig(
    double deviceLimitFraction,
    long deviceLimitBytes,
    long retentionCapBytes,
    long maxOversizeBytes,
    long unmapWaitMillis,
    long maxPublishedBytes,
    long offloadMaxBytes,
    boolean parkIdleObjects) {

  /** Reads and checks the pool options; a problem is recorded in {@code s}. */
  static PoolConfig from(Settings s) {
    return new PoolConfig(
        s.fraction("device-limit-fraction"),
        s.size("device-limit-bytes"),
        s.text("retention-cap-bytes").isEmpty() ? -1 : s.size("retention-cap-bytes"),
        s.size("max-oversize-bytes"),
        s.integer("unmap-wait-ms", 0, 600_000),
        s.text("max-published-bytes").isEmpty() ? -1 : s.size("max-published-bytes"),
        s.text("offload-max-bytes").isEmpty() ? HostStore.defaultMaxBytes() : s.size("offload-max-bytes"),
        s.choice("park-idle-objects", List.of("false", "true")).equals("true"));
  }

  /** The device budget for a device of the given capacity. */
  public long deviceLimit(long capacityBytes) {
    long limit = deviceLimitBytes > 0 ? deviceLimitBytes : (long) (capacityBytes * deviceLimitFraction);
    return Math.min(limit, capacityBytes) & -512L;
  }

  /** The most bytes of published objects on a device with the given budget. */
  public long publishedLimit(long deviceBudget) {
    return maxPublishedBytes < 0 ? deviceBudget : Math.min(maxPublishedBytes, deviceBudget);
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("device-limit-fraction", deviceLimitFraction);
    values.put("device-limit-bytes", deviceLimitBytes);
    values.put("retention-cap-bytes", retentionCapBytes < 0 ? "(device budget)" : retentionCapBytes);
    values.put("max-oversize-bytes", maxOversizeBytes);
    values.put("unmap-wait-ms", unmapWaitMillis);
    values.put("max-published-bytes", maxPublishedBytes < 0 ? "(device budget)" : maxPublishedBytes);
    values.put("offload-max-bytes", offloadMaxBytes);
    values.put("park-idle-objects", parkIdleObjects);
  }
}
