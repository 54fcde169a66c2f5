package io.gpumemd.server.config;

import java.util.Map;

/**
 * Bounds on what one gRPC peer can make the transport hold, per listener; part of {@link
 * ServerConfig}. The Unix socket and TCP count their connections separately, so a TCP flood
 * leaves the socket answerable for health checks and admins.
 *
 * @param maxMessageBytes largest inbound message ({@code --max-message-bytes}); the largest a
 *     client legitimately sends is a KeepAlive message of 4096 release notices, about 420 KB
 * @param maxCallsPerConnection concurrent calls (HTTP/2 streams) on one connection
 *     ({@code --max-calls-per-connection})
 * @param connectionIdleSeconds a connection without calls for this long is closed (GOAWAY; a
 *     client reconnects on its next call); 0 = never ({@code --connection-idle-timeout-seconds})
 * @param tcpMaxConnections live connections on the TCP listener; more are closed as they come
 *     ({@code --tcp-max-connections}, 0 = no limit)
 * @param unixMaxConnections live connections on the Unix socket ({@code --unix-max-connections},
 *     0 = no limit)
 * @param streamStallMillis a KeepAlive stream whose client reads none of its replies for this
 *     long is closed ({@code --stream-stall-timeout-ms}); until then the daemon reads no more of
 *     its requests once 32 KiB of replies wait unsent
 */
public record TransportLimits(
    int maxMessageBytes,
    int maxCallsPerConnection,
    long connectionIdleSeconds,
    int tcpMaxConnections,
    int unixMaxConnections,
    long streamStallMillis) {

  public static final int DEFAULT_MAX_MESSAGE_BYTES = 1 << 20;
  public static final int DEFAULT_MAX_CALLS_PER_CONNECTION = 1000;
  public static final long DEFAULT_CONNECTION_IDLE_SECONDS = 300;
  public static final int DEFAULT_TCP_MAX_CONNECTIONS = 1000;
  public static final int DEFAULT_UNIX_MAX_CONNECTIONS = 1000;
  public static final long DEFAULT_STREAM_STALL_MILLIS = 30_000;

  public static final TransportLimits DEFAULTS = new TransportLimits(DEFAULT_MAX_MESSAGE_BYTES,
      DEFAULT_MAX_CALLS_PER_CONNECTION, DEFAULT_CONNECTION_IDLE_SECONDS, DEFAULT_TCP_MAX_CONNECTIONS,
      DEFAULT_UNIX_MAX_CONNECTIONS, DEFAULT_STREAM_STALL_MILLIS);

  /** Reads and checks the transport options; a problem is recorded in {@code s}. */
  static TransportLimits from(Settings s) {
    return new TransportLimits(
        maxMessageBytes(s),
        (int) s.integer("max-calls-per-connection", 1, 1_000_000),
        s.integer("connection-idle-timeout-seconds", 0, 86_400 * 7),
        (int) s.integer("tcp-max-connections", 0, 1_000_000),
        (int) s.integer("unix-max-connections", 0, 1_000_000),
        s.integer("stream-stall-timeout-ms", 100, 3_600_000));
  }

  /** At least 64 KiB (room for any single lease or release), at most 64 MiB. */
  private static int maxMessageBytes(Settings s) {
    long bytes = s.size("max-message-bytes");
    if (s.valid("max-message-bytes") && (bytes < (64 << 10) || bytes > (64 << 20))) {
      s.problem(s.get("max-message-bytes"), "a byte size in [64KiB, 64MiB]");
      return DEFAULT_MAX_MESSAGE_BYTES;
    }
    return (int) bytes;
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("max-message-bytes", maxMessageBytes);
    values.put("max-calls-per-connection", maxCallsPerConnection);
    values.put("connection-idle-timeout-seconds", connectionIdleSeconds);
    values.put("tcp-max-connections", tcpMaxConnections);
    values.put("unix-max-connections", unixMaxConnections);
    values.put("stream-stall-timeout-ms", streamStallMillis);
  }
}
