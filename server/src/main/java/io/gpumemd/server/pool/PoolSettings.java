package io.gpumemd.server.pool;

/**
 * Limits of one device pool, validated by the configuration.
 *
 * @param limitBytes device budget: everything the pool holds from the backend never exceeds it
 * @param retentionCapBytes initial cap on cached (wholly free) segment bytes; 0 disables caching
 * @param maxOversizeBytes most a cached large block may exceed a request and still be used
 * @param unmapWaitMillis how long a miss that only fits once evicted segments are unmapped
 *     waits for the clients' confirmations before it is refused (0 = refuse at once)
 * @param publishedLimitBytes most bytes of published objects on the device (they outlive
 *     their sessions, so they are bounded apart from leases)
 */
public record PoolSettings(long limitBytes, long retentionCapBytes, long maxOversizeBytes, long unmapWaitMillis,
    long publishedLimitBytes) {
  public PoolSettings {
    if (limitBytes <= 0 || retentionCapBytes < 0 || maxOversizeBytes < 0 || unmapWaitMillis < 0
        || publishedLimitBytes < 0) {
      throw new IllegalArgumentException("pool settings: " + limitBytes + ", " + retentionCapBytes
          + ", " + maxOversizeBytes + ", " + unmapWaitMillis + ", " + publishedLimitBytes
          + " (expected: limit > 0, cap >= 0, oversize >= 0, unmap wait >= 0, published limit >= 0)");
    }
  }

  /** Published objects bounded by the budget alone. */
  public PoolSettings(long limitBytes, long retentionCapBytes, long maxOversizeBytes, long unmapWaitMillis) {
    this(limitBytes, retentionCapBytes, maxOversizeBytes, unmapWaitMillis, limitBytes);
  }

  /** Settings that refuse at once rather than wait for unmaps. */
  public PoolSettings(long limitBytes, long retentionCapBytes, long maxOversizeBytes) {
    this(limitBytes, retentionCapBytes, maxOversizeBytes, 0);
  }
}
