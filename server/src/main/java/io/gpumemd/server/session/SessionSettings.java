package io.gpumemd.server.session;

import io.gpumemd.server.books.Quota;
import io.gpumemd.server.config.QuotaConfig;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.config.SessionConfig;
import io.gpumemd.server.sharing.SharingSettings;
import java.util.HashMap;
import java.util.Map;

/**
 * Session policy, validated by the configuration.
 *
 * @param defaultTtlSeconds TTL of a session that asks for none
 * @param maxTtlSeconds highest TTL granted
 * @param graceMillis how long a session outlives its closed KeepAlive stream
 * @param leakThresholdMillis age after which a lease is reported as a possible leak (0 = off)
 * @param defaultQuota quota of sessions without an override
 * @param quotaOverrides quotas by client name
 * @param clientCacheBytes client cache allowance granted to a session that does not ask for
 *     less (0 = no client cache tier)
 * @param tenantQuota limits over all sessions of one tenant (0 = unlimited)
 * @param isolateSessions every session gets segments of its own, instead of sharing its
 *     tenant's (for processes of one uid that do not trust each other)
 * @param limits bounds on live sessions and on how fast a tenant opens them
 * @param sharing bounds on share tokens, holds and published names
 */
public record SessionSettings(
    int defaultTtlSeconds,
    int maxTtlSeconds,
    long graceMillis,
    long leakThresholdMillis,
    Quota defaultQuota,
    Map<String, Quota> quotaOverrides,
    long clientCacheBytes,
    Quota tenantQuota,
    boolean isolateSessions,
    SessionLimits limits,
    SharingSettings sharing) {

  /** Default client cache allowance per session. */
  public static final long DEFAULT_CLIENT_CACHE_BYTES = 64L << 20;

  public SessionSettings {
    quotaOverrides = Map.copyOf(quotaOverrides);
  }

  /** The default session limits. */
  public SessionSettings(int defaultTtlSeconds, int maxTtlSeconds, long graceMillis, long leakThresholdMillis,
      Quota defaultQuota, Map<String, Quota> quotaOverrides, long clientCacheBytes, Quota tenantQuota,
      boolean isolateSessions) {
    this(defaultTtlSeconds, maxTtlSeconds, graceMillis, leakThresholdMillis, defaultQuota, quotaOverrides,
        clientCacheBytes, tenantQuota, isolateSessions, SessionLimits.DEFAULTS, SharingSettings.DEFAULTS);
  }

  /** The same settings with other session limits. */
  public SessionSettings withLimits(SessionLimits other) {
    return new SessionSettings(defaultTtlSeconds, maxTtlSeconds, graceMillis, leakThresholdMillis, defaultQuota,
        quotaOverrides, clientCacheBytes, tenantQuota, isolateSessions, other, sharing);
  }

  /** The same settings with other sharing bounds. */
  public SessionSettings withSharing(SharingSettings other) {
    return new SessionSettings(defaultTtlSeconds, maxTtlSeconds, graceMillis, leakThresholdMillis, defaultQuota,
        quotaOverrides, clientCacheBytes, tenantQuota, isolateSessions, limits, other);
  }

  /** No tenant quota, tenant-wide segments. */
  public SessionSettings(int defaultTtlSeconds, int maxTtlSeconds, long graceMillis, long leakThresholdMillis,
      Quota defaultQuota, Map<String, Quota> quotaOverrides, long clientCacheBytes) {
    this(defaultTtlSeconds, maxTtlSeconds, graceMillis, leakThresholdMillis, defaultQuota, quotaOverrides,
        clientCacheBytes, Quota.UNLIMITED, false);
  }

  /** With the default client cache allowance. */
  public SessionSettings(int defaultTtlSeconds, int maxTtlSeconds, long graceMillis, long leakThresholdMillis,
      Quota defaultQuota, Map<String, Quota> quotaOverrides) {
    this(defaultTtlSeconds, maxTtlSeconds, graceMillis, leakThresholdMillis, defaultQuota, quotaOverrides,
        DEFAULT_CLIENT_CACHE_BYTES);
  }

  /**
   * The settings the operator configured: the sessions' own, with the tenancy's quota and
   * isolation. A share token that names no life gets the default (300 s) or the longest allowed,
   * whichever is shorter.
   */
  public static SessionSettings from(ServerConfig config) {
    SessionConfig sessions = config.sessions();
    Map<String, Quota> overrides = new HashMap<>();
    sessions.quotaOverrides().forEach((client, q) -> overrides.put(client, quota(q)));
    SessionConfig.Limits limits = sessions.limits();
    SessionConfig.Sharing sharing = sessions.sharing();
    return new SessionSettings(sessions.ttlSeconds(), sessions.maxTtlSeconds(), sessions.keepaliveGraceMillis(),
        sessions.leakThresholdMillis(), quota(sessions.defaultQuota()), overrides, sessions.clientCacheBytes(),
        quota(config.tenancy().tenantQuota()), config.tenancy().isolateSessions(),
        new SessionLimits(limits.maxSessions(), limits.maxSessionsPerTenant(), limits.openRatePerSecond()),
        new SharingSettings(Math.min(SharingSettings.DEFAULTS.defaultShareSeconds(), sharing.maxShareSeconds()),
            sharing.maxShareSeconds(), sharing.maxHoldsPerSession(), sharing.maxSharesPerTenant(),
            sharing.maxHoldsPerTenant()));
  }

  private static Quota quota(QuotaConfig q) {
    return new Quota(q.maxLeasedBytes(), q.maxLeases());
  }

  public static SessionSettings defaults() {
    return new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of());
  }

  Quota quotaFor(String clientName) {
    return quotaOverrides.getOrDefault(clientName, defaultQuota);
  }
}
