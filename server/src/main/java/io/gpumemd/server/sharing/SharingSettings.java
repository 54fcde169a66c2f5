package io.gpumemd.server.sharing;

/**
 * Bounds on sharing, validated by the configuration. Published bytes are bounded per device by
 * the pool ({@link io.gpumemd.server.pool.PoolSettings#publishedLimitBytes}).
 *
 * @param defaultShareSeconds life of a share token whose request names none
 * @param maxShareSeconds longest life of a share token ({@code --share-max-seconds})
 * @param maxHoldsPerSession holds one session may take by Attach and Lookup ({@code
 *     --max-holds-per-session}; 0 = no bound)
 * @param maxSharesPerTenant live share tokens plus published names of one tenant ({@code
 *     --max-shares-per-tenant}; 0 = no bound): they outlive sessions, so the session bounds do
 *     not reach them
 * @param maxHoldsPerTenant holds all sessions of one tenant may take by Attach and Lookup
 *     ({@code --max-holds-per-tenant}; 0 = no bound): without it, a tenant's many sessions
 *     multiply the per-session bound (1,000 sessions of 4,096 holds are about 2 GB of heap)
 */
public record SharingSettings(int defaultShareSeconds, int maxShareSeconds, int maxHoldsPerSession,
    int maxSharesPerTenant, int maxHoldsPerTenant) {
  /** Four sessions' worth of holds: about 8 MiB of heap per tenant at ~0.5 KB a hold. */
  public static final int DEFAULT_MAX_HOLDS_PER_TENANT = 16_384;
  public static final SharingSettings DEFAULTS =
      new SharingSettings(300, 86_400, 4096, 4096, DEFAULT_MAX_HOLDS_PER_TENANT);

  public SharingSettings {
    if (defaultShareSeconds <= 0 || maxShareSeconds <= 0 || maxHoldsPerSession < 0 || maxSharesPerTenant < 0
        || maxHoldsPerTenant < 0) {
      throw new IllegalArgumentException("sharing settings: " + defaultShareSeconds + ", " + maxShareSeconds
          + ", " + maxHoldsPerSession + ", " + maxSharesPerTenant + ", " + maxHoldsPerTenant
          + " (expected: lives > 0, bounds >= 0)");
    }
  }

  /** The life granted to a token that asks for {@code seconds} (0 = the default). */
  int grantSeconds(int seconds) {
    return Math.min(seconds <= 0 ? defaultShareSeconds : seconds, maxShareSeconds);
  }
}
