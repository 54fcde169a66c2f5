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
 * @param maxInFlight descriptors opened for replies and not yet sent, over all connections
 *     ({@code --fd-max-in-flight})
 */
public record FdChannelConfig(Path socket, int maxConnections, int maxInFlight) {

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
    return new FdChannelConfig(socket, (int) s.integer("fd-max-connections", 0, 1_000_000),
        (int) s.integer("fd-max-in-flight", 1, 1_000_000));
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("fd-socket", socket == null ? "none" : socket);
    values.put("fd-max-connections", maxConnections);
    values.put("fd-max-in-flight", maxInFlight);
  }
}
