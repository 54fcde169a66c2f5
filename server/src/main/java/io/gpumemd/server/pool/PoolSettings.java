package io.gpumemd.server.pool;

/**
 * Limits of one device pool, validated by the configuration.
 *
 * @param limitBytes device budget: everything the pool holds from the backend never exceeds it
 * @param retentionCapBytes initial cap on cached (wholly free) segment bytes; 0 disables caching
 * @param maxOversizeBytes most a cached large block may exceed a request and still be used
 * @param unmapWaitMillis how long a miss that only fits once evicted segments are unmapped
 *     waits for the clients' confirmations before it is refused (0 = refuse at once)
 */
public record PoolSettings(long limitBytes, long retentionCapBytes, long maxOversizeBytes, long unmapWaitMillis) {
  public PoolSettings {
    if (limitBytes <= 0 || retentionCapBytes < 0 || maxOversizeBytes < 0 || unmapWaitMillis < 0) {
      throw new IllegalArgumentException("pool settings: " + limitBytes + ", " + retentionCapBytes
          + ", " + maxOversizeBytes + ", " + unmapWaitMillis
          + " (expected: limit > 0, cap >= 0, oversize >= 0, unmap wait >= 0)");
    }
  }

  /** Settings that refuse at once rather than wait for unmaps. */
  public PoolSettings(long limitBytes, long retentionCapBytes, long maxOversizeBytes) {
    this(limitBytes, retentionCapBytes, maxOversizeBytes, 0);
  }
}
