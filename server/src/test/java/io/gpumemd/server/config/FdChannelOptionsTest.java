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
 * {@code --host-segments}, {@code --fd-socket} and the fd channel's bounds: defaults, the fd
 * socket derived from {@code --socket}, and the combinations that cannot work.
 */
class FdChannelOptionsTest {
  private static ServerConfig load(String... args) {
    return ServerOptions.parse(args, Map.of());
  }

  private static void rejects(String message, String... args) {
    ConfigException e = assertThrows(ConfigException.class, () -> ServerOptions.parse(args, Map.of()));
    assertTrue(e.getMessage().contains(message), "'" + e.getMessage() + "' should contain '" + message + "'");
  }

  @Test
  void defaults_fdSegments_andAnFdSocketBesideTheSocket() {
    ServerConfig c = load();
    assertTrue(c.backend().hostSegmentsByFd(), "descriptors are the default");
    assertEquals(Path.of("/tmp/gpumemd.sock.fd"), c.fdChannel().socket());
    assertEquals(1000, c.fdChannel().maxConnections());
    assertEquals(1024, c.fdChannel().maxInFlight());
    assertTrue(c.describe().contains("host-segments = fd"), c.describe());
    assertFalse(load("--host-segments", "path").backend().hostSegmentsByFd(), "path stays an option");
    assertFalse(ServerOptions.parse(new String[0], Map.of("GPUMEMD_HOST_SEGMENTS", "path")).backend().hostSegmentsByFd());
    assertTrue(c.describe().contains("fd-socket = /tmp/gpumemd.sock.fd"), c.describe());
  }

  @Test
  void fdSegments_withTheFlags_envAndChecks() {
    ServerConfig c = load("--host-segments", "fd", "--socket", "/run/g/g.sock", "--fd-max-connections", "7",
        "--fd-max-in-flight", "9");
    assertTrue(c.backend().hostSegmentsByFd());
    assertEquals(new FdChannelConfig(Path.of("/run/g/g.sock.fd"), 7, 100, 9, 128, 10_000, 300, 30_000), c.fdChannel());
    assertEquals(Path.of("/x/fd.sock"), ServerOptions.parse(new String[0],
        Map.of("GPUMEMD_HOST_SEGMENTS", "fd", "GPUMEMD_FD_SOCKET", "/x/fd.sock")).fdChannel().socket());

    rejects("host-segments: 'files' (expected: path or fd)", "--host-segments", "files");
    rejects("fd-max-in-flight: '0'", "--fd-max-in-flight", "0");
    rejects("fd-max-connections: '-1'", "--fd-max-connections", "-1");
  }

  @Test
  void theDefault_fallsBackToPaths_whereThereIsNoFdSocket() {
    ServerConfig tcpOnly = load("--socket", "none", "--listen", "127.0.0.1:0");
    assertFalse(tcpOnly.backend().hostSegmentsByFd(), "no --socket, no default fd socket: paths");
    assertNull(tcpOnly.fdChannel().socket());
    assertFalse(load("--fd-socket", "none").backend().hostSegmentsByFd(), "the fd channel turned off: paths");
    assertTrue(load("--socket", "none", "--listen", "127.0.0.1:0", "--fd-socket", "/x/fd.sock").backend()
        .hostSegmentsByFd(), "an fd socket of its own: descriptors");
  }

  @Test
  void fdSegments_needAnFdSocket_otherThanTheGrpcOne() {
    rejects("fd-socket: 'none' (expected: a socket path: --host-segments fd hands segments out over the fd channel)",
        "--host-segments", "fd", "--fd-socket", "none");
    rejects("fd-socket: '' (expected: a socket path: --socket is none, so there is no default",
        "--host-segments", "fd", "--socket", "none", "--listen", "127.0.0.1:0");
    rejects("fd-socket: '/tmp/g.sock' (expected: a path other than --socket's)",
        "--socket", "/tmp/g.sock", "--fd-socket", "/tmp/g.sock");
    assertNull(load("--fd-socket", "none").fdChannel().socket(), "without fd segments the channel may be off");
    assertEquals(Path.of("/x/fd.sock"), load("--host-segments", "fd", "--socket", "none", "--listen", "127.0.0.1:0",
        "--fd-socket", "/x/fd.sock").fdChannel().socket());
  }
}
