package io.gpumemd.server.config;

import io.gpumemd.server.books.Quota;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.sharing.SharingSettings;
import java.util.Map;

/**
 * Sessions: how long they live, what each may hold, how many there may be, and the bounds on
 * sharing; part of {@link ServerConfig}. The session layer's own {@link SessionSettings} is
 * made from this and {@link TenancyConfig} ({@link ServerConfig#sessionSettings()}).
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
    Quota defaultQuota,
    Map<String, Quota> quotaOverrides,
    long clientCacheBytes,
    SessionLimits limits,
    SharingSettings sharing) {

  public SessionConfig {
    quotaOverrides = Map.copyOf(quotaOverrides);
  }

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
        new Quota(s.size("quota-max-leased-bytes"), s.integer("quota-max-leases", 0, Long.MAX_VALUE)),
        s.quotas(),
        s.size("client-cache-bytes"),
        new SessionLimits(
            (int) s.integer("max-sessions", 0, 10_000_000),
            (int) s.integer("max-sessions-per-tenant", 0, 10_000_000),
            (int) s.integer("session-open-rate", 0, 1_000_000)),
        sharing(s));
  }

  /** The sharing bounds; token lives from one second to a week. */
  private static SharingSettings sharing(Settings s) {
    int maxSeconds = (int) s.integer("share-max-seconds", 1, 86_400 * 7);
    return new SharingSettings(Math.min(SharingSettings.DEFAULTS.defaultShareSeconds(), Math.max(1, maxSeconds)),
        Math.max(1, maxSeconds),
        (int) s.integer("max-holds-per-session", 0, 10_000_000),
        (int) s.integer("max-shares-per-tenant", 0, 10_000_000),
        (int) s.integer("max-holds-per-tenant", 0, 10_000_000));
  }

  /** The session layer's settings, with the tenant quota and isolation of {@code tenancy}. */
  SessionSettings settings(TenancyConfig tenancy) {
    return new SessionSettings(ttlSeconds, maxTtlSeconds, keepaliveGraceMillis, leakThresholdMillis, defaultQuota,
        quotaOverrides, clientCacheBytes, tenancy.tenantQuota(), tenancy.isolateSessions(), limits, sharing);
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
