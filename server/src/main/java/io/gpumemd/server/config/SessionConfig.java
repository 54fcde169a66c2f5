package io.gpumemd.server.config;

import java.util.Map;

/**
 * Sessions: how long they live, what each may hold, how many there may be, and the bounds on
 * sharing; part of {@link ServerConfig}. Plain values: the session layer makes its own settings
 * from this and {@link TenancyConfig}, so that config knows nothing of it.
 *
 * @param ttlSeconds TTL of a session that asks for none ({@code --session-ttl-seconds})
 * @param maxTtlSeconds highest TTL a client may ask for ({@code --max-session-ttl-seconds})
 * @param keepaliveGraceMillis how long a session outlives its closed KeepAlive stream ({@code
 *     --keepalive-grace-ms})
 * @param leakThresholdMillis leases held longer are reported, 0 = off ({@code --leak-threshold-ms})
 * @param defaultQuota per-session limits ({@code --quota-max-leased-bytes}, {@code --quota-max-leases})
 * @param quotaOverrides per-client quotas of the {@code --config} file, by client name
 * @param clientCacheBytes client cache allowance per session ({@code --client-cache-bytes})
 * @param limits bounds on live sessions and on how fast a tenant opens them
 * @param sharing bounds on share tokens, holds and published names
 */
public record SessionConfig(
    int ttlSeconds,
    int maxTtlSeconds,
    long keepaliveGraceMillis,
    long leakThresholdMillis,
    QuotaConfig defaultQuota,
    Map<String, QuotaConfig> quotaOverrides,
    long clientCacheBytes,
    Limits limits,
    Sharing sharing) {

  public SessionConfig {
    quotaOverrides = Map.copyOf(quotaOverrides);
  }

  /**
   * Bounds on sessions, 0 = none for each.
   *
   * @param maxSessions live sessions in all ({@code --max-sessions})
   * @param maxSessionsPerTenant live sessions of one tenant ({@code --max-sessions-per-tenant})
   * @param openRatePerSecond session opens per second per tenant ({@code --session-open-rate})
   */
  public record Limits(int maxSessions, int maxSessionsPerTenant, int openRatePerSecond) {}

  /**
   * Bounds on sharing, 0 = none for each bound.
   *
   * @param maxShareSeconds longest life of a share token, at least 1 ({@code --share-max-seconds})
   * @param maxHoldsPerSession holds one session may take ({@code --max-holds-per-session})
   * @param maxSharesPerTenant live share tokens plus published names of one tenant ({@code
   *     --max-shares-per-tenant})
   * @param maxHoldsPerTenant holds all sessions of one tenant may take ({@code --max-holds-per-tenant})
   */
  public record Sharing(int maxShareSeconds, int maxHoldsPerSession, int maxSharesPerTenant,
      int maxHoldsPerTenant) {}

  /** Reads and checks the session options; a problem is recorded in {@code s}. */
  static SessionConfig from(Settings s) {
    int ttl = (int) s.integer("session-ttl-seconds", 1, 86_400 * 7);
    int maxTtl = (int) s.integer("max-session-ttl-seconds", 1, 86_400 * 7);
    if (s.valid("session-ttl-seconds") && s.valid("max-session-ttl-seconds") && ttl > maxTtl) {
      s.problem(s.get("session-ttl-seconds"), "at most max-session-ttl-seconds=" + maxTtl);
    }
    return new SessionConfig(
        ttl,
        maxTtl,
        s.integer("keepalive-grace-ms", 0, 3_600_000),
        s.integer("leak-threshold-ms", 0, Long.MAX_VALUE / 1_000_000),
        new QuotaConfig(s.size("quota-max-leased-bytes"), s.integer("quota-max-leases", 0, Long.MAX_VALUE)),
        s.quotas(),
        s.size("client-cache-bytes"),
        new Limits(
            (int) s.integer("max-sessions", 0, 10_000_000),
            (int) s.integer("max-sessions-per-tenant", 0, 10_000_000),
            (int) s.integer("session-open-rate", 0, 1_000_000)),
        sharing(s));
  }

  /** The sharing bounds; token lives from one second to a week. */
  private static Sharing sharing(Settings s) {
    int maxSeconds = (int) s.integer("share-max-seconds", 1, 86_400 * 7);
    return new Sharing(Math.max(1, maxSeconds),
        (int) s.integer("max-holds-per-session", 0, 10_000_000),
        (int) s.integer("max-shares-per-tenant", 0, 10_000_000),
        (int) s.integer("max-holds-per-tenant", 0, 10_000_000));
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("session-ttl-seconds", ttlSeconds);
    values.put("max-session-ttl-seconds", maxTtlSeconds);
    values.put("keepalive-grace-ms", keepaliveGraceMillis);
    values.put("leak-threshold-ms", leakThresholdMillis);
    values.put("quota-max-leased-bytes", defaultQuota.maxLeasedBytes());
    values.put("quota-max-leases", defaultQuota.maxLeases());
    values.put("client-cache-bytes", clientCacheBytes);
    values.put("max-sessions", limits.maxSessions());
    values.put("max-sessions-per-tenant", limits.maxSessionsPerTenant());
    values.put("session-open-rate", limits.openRatePerSecond());
    values.put("share-max-seconds", sharing.maxShareSeconds());
    values.put("max-holds-per-session", sharing.maxHoldsPerSession());
    values.put("max-holds-per-tenant", sharing.maxHoldsPerTenant());
    values.put("max-shares-per-tenant", sharing.maxSharesPerTenant());
  }
}
