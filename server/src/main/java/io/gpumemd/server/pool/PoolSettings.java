package io.gpumemd.server.pool;

/**
 * Limits of one device pool, validated by the configuration.
 *
 * @param limitBytes device budget: everything the pool holds from the backend never exceeds it
 * @param retentionCapBytes initial cap on cached (wholly free) segment bytes; 0 disables caching
 * @param maxOversizeBytes most a cached large block may exceed a request and still be used
 */
public record PoolSettings(long limitBytes, long retentionCapBytes, long maxOversizeBytes) {
  public PoolSettings {
    if (limitBytes <= 0 || retentionCapBytes < 0 || maxOversizeBytes < 0) {
      throw new IllegalArgumentException("pool settings: " + limitBytes + ", " + retentionCapBytes
          + ", " + maxOversizeBytes + " (expected: limit > 0, cap >= 0, oversize >= 0)");
    }
  }
}
