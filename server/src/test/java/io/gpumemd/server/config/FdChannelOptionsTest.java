package io.gpumemd.server.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code --host-segments}, {@code --fd-socket} and the fd channel's bounds and deadlines:
 * defaults, flags, environment and file, the fd socket derived from {@code --socket}, values out
 * of range, and the combinations that cannot work.
 */
class FdChannelOptionsTest {
  private static ServerConfig load(String... args) {
    return ServerOptions.parse(args, Map.of());
  }

  private static void rejects(String message, String... args) {
    rejects(message, Map.of(), args);
  }

  private static void rejects(String message, Map<String, String> env, String... args) {
    ConfigException e = assertThrows(ConfigException.class, () -> ServerOptions.parse(args, env));
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
  void perTenantBounds_andDeadlines_defaults() {
    FdChannelConfig c = load().fdChannel();
    assertEquals(FdChannelConfig.defaults(Path.of("/tmp/gpumemd.sock.fd")), c);
    assertEquals(100, c.maxConnectionsPerTenant());
    assertEquals(128, c.maxInFlightPerTenant());
    assertEquals(10_000, c.firstRequestMillis());
    assertEquals(300, c.idleSeconds());
    assertEquals(30_000, c.stallMillis());
    String described = load().describe();
    for (String line : List.of("fd-max-connections-per-tenant = 100", "fd-max-in-flight-per-tenant = 128",
        "fd-first-request-timeout-ms = 10000", "fd-idle-timeout-seconds = 300", "fd-stall-timeout-ms = 30000")) {
      assertTrue(described.contains(line), line + " in " + described);
    }
  }

  @Test
  void perTenantBounds_andDeadlines_fromFlagsEnvAndFile(@TempDir Path dir) throws Exception {
    FdChannelConfig flags = load("--fd-max-connections-per-tenant", "5", "--fd-max-in-flight-per-tenant", "6",
        "--fd-first-request-timeout-ms", "700", "--fd-idle-timeout-seconds", "0", "--fd-stall-timeout-ms", "900")
        .fdChannel();
    assertEquals(new FdChannelConfig(Path.of("/tmp/gpumemd.sock.fd"), 1000, 5, 1024, 6, 700, 0, 900), flags);

    FdChannelConfig env = ServerOptions.parse(new String[0], Map.of("GPUMEMD_FD_MAX_CONNECTIONS_PER_TENANT", "0",
        "GPUMEMD_FD_MAX_IN_FLIGHT_PER_TENANT", "7", "GPUMEMD_FD_FIRST_REQUEST_TIMEOUT_MS", "100",
        "GPUMEMD_FD_IDLE_TIMEOUT_SECONDS", "60", "GPUMEMD_FD_STALL_TIMEOUT_MS", "3600000")).fdChannel();
    assertEquals(new FdChannelConfig(Path.of("/tmp/gpumemd.sock.fd"), 1000, 0, 1024, 7, 100, 60, 3_600_000), env);

    Path file = dir.resolve("gpumemd.properties");
    Files.writeString(file, "fd-max-connections-per-tenant=9\nfd-stall-timeout-ms=1234\n");
    ServerConfig fromFile = load("--config", file.toString(), "--fd-stall-timeout-ms", "4321");
    assertEquals(9, fromFile.fdChannel().maxConnectionsPerTenant());
    assertEquals(4321, fromFile.fdChannel().stallMillis(), "the flag wins over the file");
    assertTrue(fromFile.describe().contains("fd-max-connections-per-tenant = 9  [file " + file + "]"),
        fromFile.describe());
  }

  @Test
  void perTenantBounds_andDeadlines_outOfRange_areRejectedTogether_namingEach() {
    ConfigException e = assertThrows(ConfigException.class, () -> load("--fd-max-connections-per-tenant", "-1",
        "--fd-max-in-flight-per-tenant", "0", "--fd-first-request-timeout-ms", "99", "--fd-idle-timeout-seconds",
        "604801", "--fd-stall-timeout-ms", "soon"));
    for (String problem : List.of(
        "fd-max-connections-per-tenant: '-1' (expected: an integer in [0, 1000000]) [flag --fd-max-connections-per-tenant]",
        "fd-max-in-flight-per-tenant: '0' (expected: an integer in [1, 1000000])",
        "fd-first-request-timeout-ms: '99' (expected: an integer in [100, 3600000])",
        "fd-idle-timeout-seconds: '604801' (expected: an integer in [0, 604800])",
        "fd-stall-timeout-ms: 'soon' (expected: an integer in [100, 3600000])")) {
      assertTrue(e.getMessage().contains(problem), "'" + e.getMessage() + "' should contain '" + problem + "'");
    }
    rejects("fd-max-in-flight-per-tenant: '-3' (expected: an integer in [1, 1000000]) [env "
        + "GPUMEMD_FD_MAX_IN_FLIGHT_PER_TENANT]", Map.of("GPUMEMD_FD_MAX_IN_FLIGHT_PER_TENANT", "-3"));
  }

  @Test
  void perTenantBounds_andDeadlines_areInTheHelp_withTheirEnvironmentVariables() {
    String help = ServerOptions.usage();
    for (String option : List.of("fd-max-connections-per-tenant=N", "fd-max-in-flight-per-tenant=N",
        "fd-first-request-timeout-ms=MS", "fd-idle-timeout-seconds=N", "fd-stall-timeout-ms=MS")) {
      assertTrue(help.contains("--" + option), option + " in\n" + help);
    }
    assertTrue(help.contains("env GPUMEMD_FD_MAX_IN_FLIGHT_PER_TENANT, default 128"), help);
    assertTrue(help.contains("env GPUMEMD_FD_STALL_TIMEOUT_MS, default 30000"), help);
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
