package io.gpumemd.server.config;

import java.nio.file.Path;
import java.util.Map;

/**
 * Where the daemon listens: gRPC on a Unix socket and/or TCP, and the Prometheus endpoint; part
 * of {@link ServerConfig}. Who may connect to the socket is {@link TenancyConfig}'s; how TCP
 * peers prove who they are, {@link TcpSecurityConfig}'s.
 *
 * @param socket Unix domain socket path, or null for none ({@code --socket})
 * @param listenHost TCP bind host, or empty for no TCP listener ({@code --listen})
 * @param listenPort TCP port (0 = ephemeral, for tests)
 * @param metricsHost address the metrics endpoint binds ({@code --metrics-host})
 * @param metricsPort its port, 0 for none ({@code --metrics-port})
 */
public record ListenerConfig(Path socket, String listenHost, int listenPort, String metricsHost, int metricsPort) {

  /** Reads and checks the listener options; a problem is recorded in {@code s}. */
  static ListenerConfig from(Settings s) {
    Setting socketSetting = s.get("socket");
    Setting listenSetting = s.get("listen");
    String socket = socketSetting.value().equals("none") ? "" : socketSetting.value();
    String listen = listenSetting.value().equals("none") ? "" : listenSetting.value();
    String listenHost = "";
    int listenPort = 0;
    if (!listen.isEmpty()) {
      int colon = listen.lastIndexOf(':');
      if (colon <= 0) {
        s.problem(listenSetting, "HOST:PORT, e.g. 127.0.0.1:50051, or 'none'");
      } else {
        listenHost = host(listen.substring(0, colon));
        listenPort = port(listen.substring(colon + 1));
        if (listenPort < 0) {
          s.problem(listenSetting, "HOST:PORT with a port in [0, 65535]");
          listenPort = 0;
        }
      }
    }
    if (socket.isEmpty() && listen.isEmpty()) {
      s.problem("socket/listen: both 'none' (expected: at least one listener) [" + socketSetting.where() + ", "
          + listenSetting.where() + "]");
    }
    return new ListenerConfig(socket.isEmpty() ? null : Path.of(socket), listenHost, listenPort,
        s.text("metrics-host"), (int) s.integer("metrics-port", 0, 65535));
  }

  /** The host of HOST:PORT, an IPv6 address without its brackets. */
  private static String host(String host) {
    return host.startsWith("[") && host.endsWith("]") ? host.substring(1, host.length() - 1) : host;
  }

  /** The port of HOST:PORT, or -1 when it is none. */
  private static int port(String port) {
    try {
      int value = Integer.parseInt(port);
      return value <= 65535 ? value : -1;
    } catch (NumberFormatException e) {
      return -1;
    }
  }

  public boolean tcpEnabled() {
    return !listenHost.isEmpty();
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("socket", socket == null ? "none" : socket);
    values.put("listen", tcpEnabled() ? listenHost + ":" + listenPort : "none");
    values.put("metrics-port", metricsPort);
    values.put("metrics-host", metricsHost);
  }
}
