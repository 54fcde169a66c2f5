package io.gpumemd.server.config;

import io.gpumemd.server.session.Quota;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SharingSettings;
import io.gpumemd.server.session.SessionSettings;
import java.nio.file.Path;
import java.util.Map;
import java.util.TreeMap;

/**
 * The daemon's validated, immutable configuration. Built by {@link ServerOptions}; see its
 * option declarations (and {@code --help}) for the meaning and default of each value.
 *
 * @param socket Unix domain socket path, or null for none
 * @param listenHost TCP bind host, or empty for no TCP listener
 * @param listenPort TCP port (0 = ephemeral, for tests)
 * @param retentionCapBytes cap on cached bytes per device, or -1 for "the device budget"
 * @param sessionLimits bounds on live sessions and on how fast a tenant opens them
 * @param transport bounds on connections, calls and messages per listener
 * @param sources where each value came from, by option name ({@code default}, {@code flag},
 *     {@code env GPUMEMD_…}, {@code file /path}; {@code quota.<client>} for the file's quotas),
 *     for the start log
 */
public record ServerConfig(
    Path socket,
    String listenHost,
    int listenPort,
    String backend,
    int metricsPort,
    String metricsHost,
    int hostDevices,
    long hostDeviceBytes,
    Path shmDir,
    String shmGroup,
    double deviceLimitFraction,
    long deviceLimitBytes,
    long retentionCapBytes,
    long maxOversizeBytes,
    long unmapWaitMillis,
    int sessionTtlSeconds,
    int maxSessionTtlSeconds,
    long keepaliveGraceMillis,
    long leakThresholdMillis,
    Quota defaultQuota,
    Map<String, Quota> quotaOverrides,
    long clientCacheBytes,
    TenancyConfig tenancy,
    TcpSecurityConfig security,
    SessionLimits sessionLimits,
    SharingSettings sharing,
    long maxPublishedBytes,
    TransportLimits transport,
    long drainTimeoutMillis,
    String logFormat,
    String logLevel,
    Map<String, String> sources) {

  public boolean tcpEnabled() {
    return !listenHost.isEmpty();
  }

  public SessionSettings sessionSettings() {
    return new SessionSettings(sessionTtlSeconds, maxSessionTtlSeconds, keepaliveGraceMillis,
        leakThresholdMillis, defaultQuota, quotaOverrides, clientCacheBytes, tenancy.tenantQuota(),
        tenancy.isolateSessions(), sessionLimits, sharing);
  }

  /** The most bytes of published objects on a device with the given budget. */
  public long publishedLimit(long deviceBudget) {
    return maxPublishedBytes < 0 ? deviceBudget : Math.min(maxPublishedBytes, deviceBudget);
  }

  /** The device budget for a device of the given capacity. */
  public long deviceLimit(long capacityBytes) {
    long limit = deviceLimitBytes > 0 ? deviceLimitBytes : (long) (capacityBytes * deviceLimitFraction);
    return Math.min(limit, capacityBytes) & -512L;
  }

  /** One line per value for the start log, with where it came from. */
  public String describe() {
    Map<String, Object> values = new TreeMap<>();
    values.put("socket", socket == null ? "none" : socket);
    values.put("listen", tcpEnabled() ? listenHost + ":" + listenPort : "none");
    values.put("backend", backend);
    values.put("metrics-port", metricsPort);
    values.put("metrics-host", metricsHost);
    values.put("host-devices", hostDevices);
    values.put("host-device-bytes", hostDeviceBytes);
    values.put("shm-dir", shmDir);
    values.put("shm-group", shmGroup.isEmpty() ? "(owner only)" : shmGroup);
    values.put("device-limit-fraction", deviceLimitFraction);
    values.put("device-limit-bytes", deviceLimitBytes);
    values.put("retention-cap-bytes", retentionCapBytes < 0 ? "(device budget)" : retentionCapBytes);
    values.put("max-oversize-bytes", maxOversizeBytes);
    values.put("unmap-wait-ms", unmapWaitMillis);
    values.put("session-ttl-seconds", sessionTtlSeconds);
    values.put("max-session-ttl-seconds", maxSessionTtlSeconds);
    values.put("keepalive-grace-ms", keepaliveGraceMillis);
    values.put("leak-threshold-ms", leakThresholdMillis);
    values.put("quota-max-leased-bytes", defaultQuota.maxLeasedBytes());
    values.put("quota-max-leases", defaultQuota.maxLeases());
    values.put("client-cache-bytes", clientCacheBytes);
    values.put("tenant-by", tenancy.tenantBy().name().toLowerCase(java.util.Locale.ROOT));
    values.put("admin-group", tenancy.adminGroup().isEmpty() ? "(none)" : tenancy.adminGroup());
    values.put("socket-mode", tenancy.socketMode());
    values.put("socket-group", tenancy.socketGroup().isEmpty() ? "(the daemon's)" : tenancy.socketGroup());
    values.put("isolate", tenancy.isolateSessions() ? "session" : "tenant");
    values.put("tenant-max-leased-bytes", tenancy.tenantQuota().maxLeasedBytes());
    values.put("tenant-max-leases", tenancy.tenantQuota().maxLeases());
    values.put("tls-cert", security.tlsCert() == null ? "(none: plaintext TCP)" : security.tlsCert());
    values.put("tls-key", security.tlsKey() == null ? "(none)" : security.tlsKey());
    values.put("tls-client-ca", security.tlsClientCa() == null ? "(none: no client certificates)" : security.tlsClientCa());
    values.put("admin-cert-cn", security.adminCertCommonNames().isEmpty() ? "(none)" : String.join(",", security.adminCertCommonNames()));
    values.put("tokens-file", security.tokensFile() == null ? "(none)" : security.tokensFile());
    values.put("insecure-tcp", security.insecureTcp());
    values.put("max-sessions", sessionLimits.maxSessions());
    values.put("max-sessions-per-tenant", sessionLimits.maxSessionsPerTenant());
    values.put("session-open-rate", sessionLimits.openRatePerSecond());
    values.put("max-published-bytes", maxPublishedBytes < 0 ? "(device budget)" : maxPublishedBytes);
    values.put("share-max-seconds", sharing.maxShareSeconds());
    values.put("max-holds-per-session", sharing.maxHoldsPerSession());
    values.put("max-holds-per-tenant", sharing.maxHoldsPerTenant());
    values.put("max-shares-per-tenant", sharing.maxSharesPerTenant());
    values.put("max-message-bytes", transport.maxMessageBytes());
    values.put("max-calls-per-connection", transport.maxCallsPerConnection());
    values.put("connection-idle-timeout-seconds", transport.connectionIdleSeconds());
    values.put("tcp-max-connections", transport.tcpMaxConnections());
    values.put("unix-max-connections", transport.unixMaxConnections());
    values.put("stream-stall-timeout-ms", transport.streamStallMillis());
    values.put("drain-timeout-ms", drainTimeoutMillis);
    values.put("log-format", logFormat);
    values.put("log-level", logLevel);
    StringBuilder out = new StringBuilder();
    values.forEach((k, v) -> out.append("\n  ").append(k).append(" = ").append(v)
        .append(sources.containsKey(k) && !"default".equals(sources.get(k)) ? "  [" + sources.get(k) + "]" : ""));
    quotaOverrides.forEach((client, q) -> out.append("\n  quota.").append(client).append(" = ")
        .append(q.maxLeasedBytes()).append(" bytes, ").append(q.maxLeases()).append(" leases  [")
        .append(sources.getOrDefault("quota." + client, "file")).append("]"));
    return out.toString();
  }
}
