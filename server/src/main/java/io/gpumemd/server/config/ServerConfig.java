package io.gpumemd.server.config;

import java.util.Map;
import java.util.TreeMap;

/**
 * The daemon's validated, immutable configuration: one record per concern, each built from its
 * own options by its {@code from(Settings)}. Built by {@link ServerOptions}; see its option
 * declarations (and {@code --help}) for the meaning and default of each value.
 *
 * <p>An option lives in one record: its {@code @Option} in {@link ServerOptions}, a component of
 * its record, a line of the record's {@code from} and one of its {@code describeTo}.
 *
 * @param backend which memory backend, and the host backend's simulated devices
 * @param pool each device pool's budget and caching policy
 * @param listeners the Unix socket, the TCP address and the metrics endpoint
 * @param fdChannel the socket where clients fetch segments as file descriptors, and its bounds
 * @param security how TCP callers prove who they are (TLS, client certificates, tokens)
 * @param tenancy who the callers are, what keeps them apart, who may connect to the socket
 * @param sessions session lives, quotas, bounds on sessions and on sharing
 * @param transport bounds on connections, calls and messages per listener
 * @param logging log format and level
 * @param takeOver taking over a running daemon at start, and handing over to a successor
 * @param drainTimeoutMillis on SIGTERM, how long leases may drain ({@code --drain-timeout-ms})
 * @param sources where each value came from, by option name ({@code default}, {@code flag},
 *     {@code env GPUMEMD_…}, {@code file /path}; {@code quota.<client>} for the file's quotas),
 *     for the start log
 */
public record ServerConfig(
    BackendConfig backend,
    PoolConfig pool,
    ListenerConfig listeners,
    FdChannelConfig fdChannel,
    TcpSecurityConfig security,
    TenancyConfig tenancy,
    SessionConfig sessions,
    TransportLimits transport,
    LoggingConfig logging,
    TakeOverConfig takeOver,
    long drainTimeoutMillis,
    Map<String, String> sources) {

  public ServerConfig {
    sources = Map.copyOf(sources);
  }

  /**
   * Builds every record from its options, in this order (which is the order of their problems in
   * a {@link ConfigException}); a problem is recorded in {@code s}.
   */
  static ServerConfig from(Settings s) {
    BackendConfig backend = BackendConfig.from(s);
    PoolConfig pool = PoolConfig.from(s);
    ListenerConfig listeners = ListenerConfig.from(s);
    FdChannelConfig fdChannel = FdChannelConfig.from(s, backend, listeners);
    TcpSecurityConfig security = TcpSecurityConfig.from(s, listeners);
    TenancyConfig tenancy = TenancyConfig.from(s);
    SessionConfig sessions = SessionConfig.from(s);
    TransportLimits transport = TransportLimits.from(s);
    long drainTimeoutMillis = s.integer("drain-timeout-ms", 0, 3_600_000);
    LoggingConfig logging = LoggingConfig.from(s);
    TakeOverConfig takeOver = TakeOverConfig.from(s, listeners);
    return new ServerConfig(backend, pool, listeners, fdChannel, security, tenancy, sessions, transport, logging,
        takeOver, drainTimeoutMillis, s.sources());
  }

  /** One line per value for the start log, by option name, with where it came from. */
  public String describe() {
    Map<String, Object> values = new TreeMap<>();
    backend.describeTo(values);
    pool.describeTo(values);
    listeners.describeTo(values);
    fdChannel.describeTo(values);
    security.describeTo(values);
    tenancy.describeTo(values);
    sessions.describeTo(values);
    transport.describeTo(values);
    logging.describeTo(values);
    takeOver.describeTo(values);
    values.put("drain-timeout-ms", drainTimeoutMillis);
    StringBuilder out = new StringBuilder();
    values.forEach((k, v) -> out.append("\n  ").append(k).append(" = ").append(v)
        .append(sources.containsKey(k) && !"default".equals(sources.get(k)) ? "  [" + sources.get(k) + "]" : ""));
    sessions.quotaOverrides().forEach((client, q) -> out.append("\n  quota.").append(client).append(" = ")
        .append(q.maxLeasedBytes()).append(" bytes, ").append(q.maxLeases()).append(" leases  [")
        .append(sources.getOrDefault("quota." + client, "file")).append("]"));
    return out.toString();
  }
}
