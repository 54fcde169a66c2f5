package io.gpumemd.server.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.books.Quota;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SessionSettings;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ServerOptionsTest {
  /** Every option of the command line, by name. */
  private static final List<String> OPTIONS = List.of("socket", "listen", "backend", "metrics-port", "metrics-host",
      "host-devices", "host-device-bytes", "shm-dir", "shm-group", "device-limit-fraction", "device-limit-bytes",
      "retention-cap-bytes", "max-oversize-bytes", "unmap-wait-ms", "session-ttl-seconds", "max-session-ttl-seconds",
      "keepalive-grace-ms", "leak-threshold-ms", "quota-max-leased-bytes", "quota-max-leases", "drain-timeout-ms",
      "log-format", "log-level", "config", "max-sessions", "max-sessions-per-tenant", "session-open-rate",
      "max-message-bytes", "max-calls-per-connection", "connection-idle-timeout-seconds", "tcp-max-connections",
      "unix-max-connections", "stream-stall-timeout-ms");

  @TempDir
  Path dir;

  private static ServerConfig load(Map<String, String> env, String... args) {
    return ServerOptions.parse(args, env);
  }

  private static ConfigException rejects(String message, Map<String, String> env, String... args) {
    ConfigException e = assertThrows(ConfigException.class, () -> ServerOptions.parse(args, env));
    assertTrue(e.getMessage().contains(message), "'" + e.getMessage() + "' should contain '" + message + "'");
    return e;
  }

  @Test
  void defaults_matchTheDesign() {
    ServerConfig c = load(Map.of());
    assertEquals(Path.of("/tmp/gpumemd.sock"), c.listeners().socket());
    assertEquals("", c.listeners().listenHost(), "TCP is off unless asked for");
    assertFalse(c.listeners().tcpEnabled());
    assertEquals("auto", c.backend().kind());
    assertEquals(9464, c.listeners().metricsPort());
    assertEquals(1L << 30, c.backend().hostDeviceBytes());
    assertEquals(-1, c.pool().retentionCapBytes(), "default cap: the device budget");
    assertEquals("plain", c.logging().format());
    assertEquals("INFO", c.logging().level());
    assertEquals(Path.of("/dev/shm/gpumemd"), c.backend().shmDir());
    assertEquals("", c.backend().shmGroup());
    assertEquals(0.9, c.pool().deviceLimitFraction());
    assertEquals(20L << 20, c.pool().maxOversizeBytes());
    assertEquals(30, c.sessions().ttlSeconds());
    assertEquals(3600, c.sessions().maxTtlSeconds());
    assertEquals(10_000, c.drainTimeoutMillis());
    assertEquals(QuotaConfig.UNLIMITED, c.sessions().defaultQuota());
    assertTrue(c.sessions().quotaOverrides().isEmpty());
    OPTIONS.forEach(name -> assertEquals("default", c.sources().get(name), name));
  }

  @Test
  void limits_haveDefaults_flagsEnvAndFile_andAreChecked() throws Exception {
    ServerConfig d = load(Map.of());
    assertEquals(new SessionConfig.Limits(10_000, 1_000, 100), d.sessions().limits());
    assertEquals(new TransportLimits(1 << 20, 1000, 300, 1000, 1000, 30_000), d.transport());
    assertEquals(new SessionLimits(10_000, 1_000, 100), SessionSettings.from(d).limits());
    Path file = dir.resolve("limits.properties");
    Files.writeString(file, "tcp-max-connections=50\nconnection-idle-timeout-seconds=0\n");
    ServerConfig c = load(Map.of("GPUMEMD_CONFIG", file.toString(), "GPUMEMD_SESSION_OPEN_RATE", "0",
        "GPUMEMD_MAX_MESSAGE_BYTES", "256KiB"), "--max-sessions", "5", "--max-sessions-per-tenant=2",
        "--max-calls-per-connection", "10", "--unix-max-connections", "7", "--stream-stall-timeout-ms", "2500");
    assertEquals(new SessionConfig.Limits(5, 2, 0), c.sessions().limits());
    assertEquals(new TransportLimits(256 << 10, 10, 0, 50, 7, 2500), c.transport());
    assertTrue(c.describe().contains("max-message-bytes = 262144  [env GPUMEMD_MAX_MESSAGE_BYTES]"), c.describe());
    rejects("max-message-bytes: '1KiB' (expected: a byte size in [64KiB, 64MiB])", Map.of(),
        "--max-message-bytes", "1KiB");
    rejects("max-sessions: '-1' (expected: an integer in [0, 10000000])", Map.of(), "--max-sessions", "-1");
    rejects("max-calls-per-connection: '0' (expected: an integer in [1, 1000000])", Map.of(),
        "--max-calls-per-connection", "0");
    rejects("session-open-rate: 'fast' (expected: an integer in [0, 1000000])", Map.of(),
        "--session-open-rate", "fast");
    rejects("stream-stall-timeout-ms: '0' (expected: an integer in [100, 3600000])", Map.of(),
        "--stream-stall-timeout-ms", "0");
  }

  @Test
  void parkIdleObjects_isOffByDefault_andOnByFlagOrEnvironment() {
    assertFalse(load(Map.of()).pool().parkIdleObjects());
    assertTrue(load(Map.of(), "--park-idle-objects").pool().parkIdleObjects());
    assertTrue(load(Map.of("GPUMEMD_PARK_IDLE_OBJECTS", "true")).pool().parkIdleObjects());
    assertFalse(load(Map.of(), "--park-idle-objects=false").pool().parkIdleObjects());
  }

  @Test
  void sizes_acceptBinarySuffixes() {
    assertEquals(512L << 20, load(Map.of(), "--retention-cap-bytes", "512MiB").pool().retentionCapBytes());
    assertEquals(8L << 30, load(Map.of(), "--retention-cap-bytes", "8GiB").pool().retentionCapBytes());
    assertEquals(2L << 30, load(Map.of(), "--retention-cap-bytes", "2g").pool().retentionCapBytes());
    assertEquals(4096, load(Map.of(), "--retention-cap-bytes", "4096").pool().retentionCapBytes());
    assertEquals(1L << 40, load(Map.of(), "--retention-cap-bytes=1 TiB").pool().retentionCapBytes());
    rejects("retention-cap-bytes: '-1' (expected: a byte size", Map.of(), "--retention-cap-bytes=-1");
    rejects("retention-cap-bytes: '99999999999TiB' (expected: a size below 8 EiB)", Map.of(),
        "--retention-cap-bytes", "99999999999TiB");
    rejects("retention-cap-bytes: '5 parsecs' (expected: a byte size with suffix", Map.of(),
        "--retention-cap-bytes", "5 parsecs");
  }

  @Test
  void precedence_flagOverEnvOverFileOverDefault() throws Exception {
    Path file = dir.resolve("gpumemd.properties");
    Files.writeString(file, "retention-cap-bytes = 1GiB\nhost-devices = 3\nmetrics-port = 1234\n");
    ServerConfig c = load(Map.of("GPUMEMD_CONFIG", file.toString(), "GPUMEMD_HOST_DEVICES", "5",
        "GPUMEMD_RETENTION_CAP_BYTES", "256MiB"), "--retention-cap-bytes", "128MiB");
    assertEquals(128L << 20, c.pool().retentionCapBytes());
    assertEquals(5, c.backend().hostDevices());
    assertEquals(1234, c.listeners().metricsPort());
    assertEquals(1L << 30, c.backend().hostDeviceBytes(), "no layer sets it: the default");
    assertEquals("flag", c.sources().get("retention-cap-bytes"));
    assertEquals("env GPUMEMD_HOST_DEVICES", c.sources().get("host-devices"));
    assertEquals("file " + file, c.sources().get("metrics-port"));
    assertEquals("env GPUMEMD_CONFIG", c.sources().get("config"));
    assertEquals("default", c.sources().get("host-device-bytes"));
    assertTrue(c.describe().contains("retention-cap-bytes = 134217728  [flag]"), c.describe());
    assertTrue(c.describe().contains("host-devices = 5  [env GPUMEMD_HOST_DEVICES]"), c.describe());
    assertTrue(c.describe().contains("metrics-port = 1234  [file " + file + "]"), c.describe());
    assertTrue(c.describe().contains("host-device-bytes = 1073741824\n"), "defaults carry no source: " + c.describe());
  }

  @Test
  void precedence_eachLayerWinsOverTheOnesBelow_forEveryOption() throws Exception {
    // One option at a time through all four layers, so that no option skips one.
    Path file = dir.resolve("layers.properties");
    Files.writeString(file, "drain-timeout-ms=3000\nlog-level=warn\n");
    Map<String, String> env = Map.of("GPUMEMD_CONFIG", file.toString(), "GPUMEMD_DRAIN_TIMEOUT_MS", "2000");
    assertEquals(10_000, load(Map.of()).drainTimeoutMillis());
    assertEquals(3000, load(Map.of("GPUMEMD_CONFIG", file.toString())).drainTimeoutMillis());
    assertEquals(2000, load(env).drainTimeoutMillis());
    assertEquals(1000, load(env, "--drain-timeout-ms", "1000").drainTimeoutMillis());
    assertEquals("WARN", load(env).logging().level(), "values are case-insensitive where they are words");
    assertEquals(500, load(Map.of(), "--drain-timeout-ms", "1000", "--drain-timeout-ms=500").drainTimeoutMillis(),
        "a later flag wins");
    Path other = dir.resolve("other.properties");
    Files.writeString(other, "drain-timeout-ms=4000\n");
    ServerConfig c = load(Map.of("GPUMEMD_CONFIG", file.toString()), "--config", other.toString());
    assertEquals(4000, c.drainTimeoutMillis(), "--config wins over GPUMEMD_CONFIG");
    assertEquals("INFO", c.logging().level(), "only the flag's file is read");
  }

  @Test
  void quotaOverrides_comeFromTheFile() throws Exception {
    Path file = dir.resolve("q.properties");
    Files.writeString(file, "quota.trainer.max-leased-bytes=8GiB\nquota.trainer.max-leases=10\nquota-max-leases=100\n"
        + "quota.web.front.max-leases = 3\n");
    ServerConfig c = load(Map.of(), "--config=" + file);
    assertEquals(new QuotaConfig(8L << 30, 10), c.sessions().quotaOverrides().get("trainer"));
    assertEquals(new QuotaConfig(0, 3), c.sessions().quotaOverrides().get("web.front"), "client names may contain dots");
    assertEquals(new QuotaConfig(0, 100), c.sessions().defaultQuota());
    assertEquals(new Quota(8L << 30, 10), SessionSettings.from(c).quotaOverrides().get("trainer"));
    assertTrue(c.describe().contains("quota.trainer = 8589934592 bytes, 10 leases  [file " + file + "]"), c.describe());
    Files.writeString(file, "quota.trainer.max-bytes=1\n");
    rejects("file key: 'quota.trainer.max-bytes' (expected: quota.<client_name>.max-leased-bytes or "
        + "quota.<client_name>.max-leases) [file " + file + "]", Map.of(), "--config", file.toString());
    Files.writeString(file, "quota.trainer.max-leased-bytes=lots\nquota.trainer.max-leases=-1\n");
    ConfigException e = rejects("quota.trainer.max-leased-bytes: 'lots' (expected: a byte size", Map.of(),
        "--config", file.toString());
    assertTrue(e.getMessage().contains("quota.trainer.max-leases: '-1' (expected: an integer >= 0) [file " + file + "]"),
        e.getMessage());
  }

  @Test
  void unknownFileKeys_areErrors_allOfThem() throws Exception {
    Path file = dir.resolve("typos.properties");
    Files.writeString(file, "retention-cap=1GiB\nhelp=true\nconfig=/elsewhere\nmetrics-port=9\n");
    ConfigException e = rejects("file key: 'retention-cap' (expected: an option listed by --help", Map.of(),
        "--config", file.toString());
    assertEquals(3, e.problems().size(), e.getMessage());
    assertTrue(e.getMessage().contains("file key: 'help'"), e.getMessage());
    assertTrue(e.getMessage().contains("file key: 'config'"), e.getMessage());
  }

  @Test
  void listeners_canBeTurnedOffButNotBoth() {
    ServerConfig c = load(Map.of(), "--socket", "none", "--listen", "127.0.0.1:7000");
    assertNull(c.listeners().socket());
    assertEquals(7000, c.listeners().listenPort());
    assertEquals("", load(Map.of(), "--listen", "none").listeners().listenHost());
    assertEquals("::1", load(Map.of(), "--listen", "[::1]:7001").listeners().listenHost());
    rejects("socket/listen: both 'none' (expected: at least one listener)", Map.of(),
        "--socket", "none", "--listen", "none");
  }

  @Test
  void badValues_areNamedWithWhatWasExpected() {
    rejects("backend: 'gpu' (expected: auto, host or cuda) [flag --backend]", Map.of(), "--backend", "gpu");
    rejects("listen: 'localhost' (expected: HOST:PORT", Map.of(), "--listen", "localhost");
    rejects("listen: 'h:70000' (expected: HOST:PORT with a port in [0, 65535])", Map.of(), "--listen", "h:70000");
    rejects("metrics-port: 'abc' (expected: an integer in [0, 65535]) [env GPUMEMD_METRICS_PORT]",
        Map.of("GPUMEMD_METRICS_PORT", "abc"));
    rejects("device-limit-fraction: '1.5' (expected: a number in (0, 1])", Map.of(), "--device-limit-fraction", "1.5");
    rejects("host-device-bytes: '1MiB' (expected: at least 2MiB", Map.of(), "--host-device-bytes", "1MiB");
    rejects("log-format: 'xml' (expected: plain or json)", Map.of(), "--log-format", "xml");
    rejects("log-level: 'LOUD' (expected: TRACE, DEBUG, INFO, WARN or ERROR)", Map.of(), "--log-level", "LOUD");
    rejects("session-ttl-seconds: '60' (expected: at most max-session-ttl-seconds=50)", Map.of(),
        "--session-ttl-seconds", "60", "--max-session-ttl-seconds", "50");
    rejects("--socket: no value (expected: PATH after the flag)", Map.of(), "--socket");
    rejects("flag: '--sockets' (expected: one of the options listed by --help)", Map.of(), "--sockets", "x");
    rejects("argument: 'stray' (expected: --option value or --option=value)", Map.of(), "stray");
    rejects("config: '/nonexistent.properties' (expected: a readable properties file; there is no such file) "
        + "[flag --config]", Map.of(), "--config", "/nonexistent.properties");
  }

  @Test
  void everyProblem_isReportedInOneMessage_withWhereItCameFrom() throws Exception {
    Path file = dir.resolve("bad.properties");
    Files.writeString(file, "drain-timeout-ms = soon\n");
    ConfigException e = rejects("4 invalid settings:", Map.of("GPUMEMD_CONFIG", file.toString(),
        "GPUMEMD_HOST_DEVICE_BYTES", "12 parsecs"), "--metrics-port", "-5", "--frobnicate", "1");
    assertEquals(List.of(
        "flag: '--frobnicate' (expected: one of the options listed by --help)",
        "host-device-bytes: '12 parsecs' (expected: a byte size with suffix B, KiB, MiB, GiB or TiB) "
            + "[env GPUMEMD_HOST_DEVICE_BYTES]",
        "metrics-port: '-5' (expected: an integer in [0, 65535]) [flag --metrics-port]",
        "drain-timeout-ms: 'soon' (expected: an integer in [0, 3600000]) [file " + file + "]"),
        e.problems());
    for (String problem : e.problems()) {
      assertTrue(e.getMessage().contains("\n  " + problem), "one line per problem: " + e.getMessage());
    }
  }

  @Test
  void oneProblem_isTheWholeMessage() {
    ConfigException e = rejects("host-device-bytes", Map.of(), "--host-device-bytes", "12 parsecs");
    assertEquals("host-device-bytes: '12 parsecs' (expected: a byte size with suffix B, KiB, MiB, GiB or TiB) "
        + "[flag --host-device-bytes]", e.getMessage());
  }

  @Test
  void help_listsEveryOption_withItsEnvironmentVariableAndDefault() {
    String help = ServerOptions.usage();
    for (String name : OPTIONS) {
      String env = "GPUMEMD_" + name.toUpperCase(java.util.Locale.ROOT).replace('-', '_');
      Matcher option = Pattern.compile("--" + Pattern.quote(name) + "=\\S+").matcher(help);
      assertTrue(option.find(), "--" + name + " missing from --help:\n" + help);
      // the option's env line comes after its own flag and before the next option's
      // (an option's line is indented a little, a wrapped description line far more)
      Matcher next = Pattern.compile("\n\\s{0,8}-").matcher(help);
      String block = help.substring(option.start(), next.find(option.end()) ? next.start() : help.length());
      assertTrue(block.contains("env " + env), "--" + name + " without env " + env + ":\n" + block);
    }
    assertTrue(help.contains("env GPUMEMD_RETENTION_CAP_BYTES\n"), "no default shown where there is none:\n" + help);
    assertTrue(help.contains("env GPUMEMD_HOST_DEVICE_BYTES, default 1GiB"), help);
    assertTrue(help.contains("env GPUMEMD_SOCKET, default /tmp/gpumemd.sock"), help);
    assertTrue(help.contains("-h, --help"), help);
    assertTrue(help.contains("quota.<client_name>.max-leased-bytes"), help);
    assertFalse(help.contains("GPUMEMD_HELP"), "--help has no environment variable:\n" + help);
  }

  @Test
  void helpRequested_evenAmongOtherFlags() {
    assertTrue(ServerOptions.helpRequested(new String[] {"--socket", "/x", "--help"}));
    assertTrue(ServerOptions.helpRequested(new String[] {"-h", "--frobnicate"}));
    assertFalse(ServerOptions.helpRequested(new String[] {"--socket", "/x"}));
  }

  @Test
  void deviceLimit_isAFractionOfCapacityUnlessGivenInBytes() {
    assertEquals((long) (0.9 * (1L << 30)) & -512L, load(Map.of()).pool().deviceLimit(1L << 30));
    assertEquals(100L << 20, load(Map.of(), "--device-limit-bytes", "100MiB").pool().deviceLimit(1L << 30));
    assertEquals(1L << 30, load(Map.of(), "--device-limit-bytes", "100GiB").pool().deviceLimit(1L << 30));
  }

  @Test
  void maxHoldsPerTenant_hasADefault_flagEnvAndFile_andIsChecked() throws Exception {
    assertEquals(16_384, SessionSettings.from(load(Map.of())).sharing().maxHoldsPerTenant());
    Path file = dir.resolve("holds.properties");
    Files.writeString(file, "max-holds-per-tenant=300\n");
    assertEquals(300, SessionSettings.from(load(Map.of("GPUMEMD_CONFIG", file.toString()))).sharing().maxHoldsPerTenant());
    ServerConfig env = load(Map.of("GPUMEMD_CONFIG", file.toString(), "GPUMEMD_MAX_HOLDS_PER_TENANT", "200"));
    assertEquals(200, SessionSettings.from(env).sharing().maxHoldsPerTenant());
    assertTrue(env.describe().contains("max-holds-per-tenant = 200  [env GPUMEMD_MAX_HOLDS_PER_TENANT]"), env.describe());
    assertEquals(0, SessionSettings.from(load(Map.of("GPUMEMD_MAX_HOLDS_PER_TENANT", "200"), "--max-holds-per-tenant",
        "0")).sharing().maxHoldsPerTenant(), "0 = no bound, and the flag wins");
    rejects("max-holds-per-tenant: '-1' (expected: an integer in [0, 10000000])", Map.of(),
        "--max-holds-per-tenant", "-1");
  }
}
