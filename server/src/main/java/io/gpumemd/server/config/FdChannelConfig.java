package io.gpumemd.server.config;

import java.nio.file.Path;
import java.util.List;
import java.util.Map;

/**
 * The fd channel: the Unix socket where clients fetch segments as file descriptors ({@code
 * --host-segments fd}, {@code --cuda-handles vmm}), and its bounds; part of {@link
 * ServerConfig}. Its mode and group are the gRPC socket's ({@link TenancyConfig}).
 *
 * @param socket its path, or null for none ({@code --fd-socket}; by default the {@code --socket}
 *     path with {@code .fd} appended). The daemon serves it only when its backend passes segments
 *     as descriptors
 * @param maxConnections live connections; more are closed as they come ({@code
 *     --fd-max-connections}, 0 = no limit)
 * @param maxConnectionsPerTenant live connections of one tenant (the tenant the peer's
 *     credentials give); more of its connections are closed as they come, so that one tenant
 *     cannot take every place of {@code maxConnections} ({@code --fd-max-connections-per-tenant},
 *     0 = no limit)
 * @param maxInFlight descriptors opened for replies and not yet sent, over all connections
 *     ({@code --fd-max-in-flight})
 * @param maxInFlightPerTenant the same, over the connections of one tenant ({@code
 *     --fd-max-in-flight-per-tenant}): a tenant whose connections never read cannot hold every
 *     place of {@code maxInFlight}
 * @param firstRequestMillis a connection without a complete request this long after it
 *     connected is closed ({@code --fd-first-request-timeout-ms}): idle and half-sent first
 *     frames hold a place of the connection bounds no longer
 * @param idleSeconds a connection that sends no complete request and is owed no reply this long
 *     is closed; 0 = never ({@code --fd-idle-timeout-seconds})
 * @param stallMillis a connection whose replies (frames or descriptors) stay unwritten this long
 *     without any of them going out is closed, and its unsent descriptors with it ({@code
 *     --fd-stall-timeout-ms})
 */
public record FdChannelConfig(
    Path socket,
    int maxConnections,
    int maxConnectionsPerTenant,
    int maxInFlight,
    int maxInFlightPerTenant,
    long firstRequestMillis,
    long idleSeconds,
    long stallMillis) {

  public static final int DEFAULT_MAX_CONNECTIONS = 1000;
  /**
   * A tenth of the channel's: a client process keeps one connection, so a hundred processes of
   * one tenant connect at once, and ten tenants at their bound still leave room.
   */
  public static final int DEFAULT_MAX_CONNECTIONS_PER_TENANT = 100;
  public static final int DEFAULT_MAX_IN_FLIGHT = 1024;
  /**
   * An eighth of the channel's: eight connections' worth of their 16 unsent descriptors each. A
   * client that reads holds a place for the microseconds of one write.
   */
  public static final int DEFAULT_MAX_IN_FLIGHT_PER_TENANT = 128;
  /** A client sends its request as soon as it connects; 10 s is room for a stalled scheduler. */
  public static final long DEFAULT_FIRST_REQUEST_MILLIS = 10_000;
  /** The gRPC listeners' default ({@code --connection-idle-timeout-seconds}). */
  public static final long DEFAULT_IDLE_SECONDS = 300;
  /** The KeepAlive streams' default ({@code --stream-stall-timeout-ms}). */
  public static final long DEFAULT_STALL_MILLIS = 30_000;

  /** Every bound at its default, on {@code socket}. */
  public static FdChannelConfig defaults(Path socket) {
    return new FdChannelConfig(socket, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_TENANT,
        DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT_PER_TENANT, DEFAULT_FIRST_REQUEST_MILLIS, DEFAULT_IDLE_SECONDS,
        DEFAULT_STALL_MILLIS);
  }

  /**
   * Whether host segments go out as descriptors: {@code --host-segments fd} (the default) or
   * {@code path}. The default falls back to {@code path} where the daemon has no fd socket to
   * serve them from ({@code --socket none} without {@code --fd-socket}, or {@code --fd-socket
   * none}): such a daemon's clients could not fetch a descriptor. An explicit {@code fd} there
   * is a problem ({@link #from}).
   */
  static boolean segmentsByFd(Settings s) {
    Setting setting = s.get("host-segments");
    boolean fd = s.choice("host-segments", List.of("path", "fd")).equals("fd");
    if (!fd || !setting.origin().equals("default")) {
      return fd;
    }
    String fdSocket = s.text("fd-socket");
    return !fdSocket.equals("none") && (!fdSocket.isEmpty() || !s.text("socket").equals("none"));
  }

  /**
   * Reads the fd channel's options; a problem is recorded in {@code s}: descriptor segments
   * without a channel, or a channel on the gRPC socket's own path.
   */
  static FdChannelConfig from(Settings s, BackendConfig backend, ListenerConfig listeners) {
    Setting setting = s.get("fd-socket");
    String value = setting.value();
    Path socket;
    if (value.equals("none")) {
      socket = null;
    } else if (value.isEmpty()) {
      socket = listeners.socket() == null ? null : Path.of(listeners.socket() + ".fd");
    } else {
      socket = Path.of(value);
    }
    if (backend.hostSegmentsByFd() && socket == null) {
      s.problem(setting, value.equals("none")
          ? "a socket path: --host-segments fd hands segments out over the fd channel"
          : "a socket path: --socket is none, so there is no default, and --host-segments fd hands segments "
              + "out over the fd channel");
    } else if (backend.cudaHandles().equals("vmm") && !backend.kind().equals("host") && socket == null) {
      s.problem(setting, "a socket path: --cuda-handles vmm hands CUDA segments out over the fd channel");
    } else if (socket != null && listeners.socket() != null
        && socket.toAbsolutePath().equals(listeners.socket().toAbsolutePath())) {
      s.problem(setting, "a path other than --socket's");
    }
    return new FdChannelConfig(socket,
        (int) s.integer("fd-max-connections", 0, 1_000_000),
        (int) s.integer("fd-max-connections-per-tenant", 0, 1_000_000),
        (int) s.integer("fd-max-in-flight", 1, 1_000_000),
        (int) s.integer("fd-max-in-flight-per-tenant", 1, 1_000_000),
        s.integer("fd-first-request-timeout-ms", 100, 3_600_000),
        s.integer("fd-idle-timeout-seconds", 0, 86_400 * 7),
        s.integer("fd-stall-timeout-ms", 100, 3_600_000));
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("fd-socket", socket == null ? "none" : socket);
    values.put("fd-max-connections", maxConnections);
    values.put("fd-max-connections-per-tenant", maxConnectionsPerTenant);
    values.put("fd-max-in-flight", maxInFlight);
    values.put("fd-max-in-flight-per-tenant", maxInFlightPerTenant);
    values.put("fd-first-request-timeout-ms", firstRequestMillis);
    values.put("fd-idle-timeout-seconds", idleSeconds);
    values.put("fd-stall-timeout-ms", stallMillis);
  }
}
