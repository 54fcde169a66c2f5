package io.gpumemd.server.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * {@code --take-over}, {@code --take-over-socket} and {@code --after-hand-over}: defaults, the
 * take-over socket derived from {@code --socket}, and the combinations that cannot work.
 */
class TakeOverOptionsTest {
  private static ServerConfig load(String... args) {
    return ServerOptions.parse(args, Map.of());
  }

  private static void rejects(String message, String... args) {
    ConfigException e = assertThrows(ConfigException.class, () -> ServerOptions.parse(args, Map.of()));
    assertTrue(e.getMessage().contains(message), "'" + e.getMessage() + "' should contain '" + message + "'");
  }

  @Test
  void defaults_noTakeOver_aTakeOverSocketBesideTheSocket_exitAfterHandOver() {
    TakeOverConfig t = load().takeOver();
    assertFalse(t.takeOver());
    assertEquals(Path.of("/tmp/gpumemd.sock.takeover"), t.socket());
    assertTrue(t.exitAfterHandOver());
    assertTrue(load().describe().contains("take-over-socket = /tmp/gpumemd.sock.takeover"), load().describe());
  }

  @Test
  void flagsAndEnvironment() {
    TakeOverConfig t = load("--take-over", "--socket", "/run/g/g.sock", "--after-hand-over", "wait").takeOver();
    assertEquals(new TakeOverConfig(true, Path.of("/run/g/g.sock.takeover"), false), t);
    assertEquals(Path.of("/x/t.sock"), load("--take-over-socket", "/x/t.sock").takeOver().socket());
    assertNull(load("--take-over-socket", "none").takeOver().socket(), "none: take-overs refused");
    assertTrue(ServerOptions.parse(new String[0], Map.of("GPUMEMD_TAKE_OVER", "true")).takeOver().takeOver());
    assertNull(load("--socket", "none", "--listen", "127.0.0.1:0").takeOver().socket(), "no socket, no default");
  }

  @Test
  void refused_withWhatWouldWork() {
    rejects("after-hand-over: 'stay' (expected: exit or wait)", "--after-hand-over", "stay");
    rejects("take-over: 'maybe' (expected: false or true)", "--take-over=maybe");
    rejects("--take-over-socket is none", "--take-over", "--take-over-socket", "none");
    rejects("--socket is none, so there is no default", "--take-over", "--socket", "none", "--listen", "127.0.0.1:0");
    rejects("take-over-socket: '/tmp/gpumemd.sock' (expected: a path other than --socket's)",
        "--take-over-socket", "/tmp/gpumemd.sock");
  }
}
