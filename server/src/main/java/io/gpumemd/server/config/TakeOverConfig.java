package io.gpumemd.server.config;

import java.nio.file.Path;
import java.util.List;
import java.util.Map;

/**
 * Upgrades without losing sessions: whether this daemon takes over a running one at start, where
 * it listens for its own successor, and what it does once one has taken over; part of {@link
 * ServerConfig}.
 *
 * @param takeOver take over the daemon behind {@code socket} at start ({@code --take-over})
 * @param socket the take-over socket, or null for none ({@code --take-over-socket}; by default
 *     the {@code --socket} path with {@code .takeover} appended)
 * @param exitAfterHandOver exit 0 once a successor took over; false: wait for SIGTERM
 *     ({@code --after-hand-over})
 */
public record TakeOverConfig(boolean takeOver, Path socket, boolean exitAfterHandOver) {

  /** Reads the take-over options; a problem is recorded in {@code s}. */
  static TakeOverConfig from(Settings s, ListenerConfig listeners) {
    boolean takeOver = s.choice("take-over", List.of("false", "true")).equals("true");
    Setting setting = s.get("take-over-socket");
    String value = setting.value();
    Path socket;
    if (value.equals("none")) {
      socket = null;
    } else if (value.isEmpty()) {
      socket = listeners.socket() == null ? null : Path.of(listeners.socket() + ".takeover");
    } else {
      socket = Path.of(value);
    }
    if (takeOver && socket == null) {
      s.problem(s.get("take-over"), "false: --take-over finds the running daemon by its take-over socket, and "
          + (value.equals("none") ? "--take-over-socket is none" : "--socket is none, so there is no default"));
    } else if (socket != null && listeners.socket() != null
        && socket.toAbsolutePath().equals(listeners.socket().toAbsolutePath())) {
      s.problem(setting, "a path other than --socket's");
    }
    boolean exit = s.choice("after-hand-over", List.of("exit", "wait")).equals("exit");
    return new TakeOverConfig(takeOver, socket, exit);
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("take-over", takeOver);
    values.put("take-over-socket", socket == null ? "none" : socket);
    values.put("after-hand-over", exitAfterHandOver ? "exit" : "wait");
  }
}
