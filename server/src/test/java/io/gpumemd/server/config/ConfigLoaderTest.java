package io.gpumemd.server.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.session.Quota;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ConfigLoaderTest {
  @TempDir
  Path dir;

  private static ServerConfig load(Map<String, String> env, String... args) {
    return ConfigLoader.load(args, env);
  }

  private static void rejects(String message, Map<String, String> env, String... args) {
    ConfigException e = assertThrows(ConfigException.class, () -> ConfigLoader.load(args, env));
    assertTrue(e.getMessage().contains(message), "'" + e.getMessage() + "' should contain '" + message + "'");
  }

  @Test
  void defaults_matchTheDesign() {
    ServerConfig c = load(Map.of());
    assertEquals(Path.of("/tmp/gpumemd.sock"), c.socket());
    assertEquals("127.0.0.1", c.listenHost());
    assertEquals(50051, c.listenPort());
    assertEquals("auto", c.backend());
    assertEquals(9464, c.metricsPort());
    assertEquals(1L << 30, c.hostDeviceBytes());
    assertEquals(-1, c.retentionCapBytes(), "default cap: the device budget");
    assertEquals("plain", c.logFormat());
  }

  @Test
  void sizes_acceptBinarySuffixes() {
    assertEquals(512L << 20, Sizes.parse("x", "512MiB"));
    assertEquals(8L << 30, Sizes.parse("x", "8GiB"));
    assertEquals(2L << 30, Sizes.parse("x", "2g"));
    assertEquals(4096, Sizes.parse("x", "4096"));
    assertEquals(1L << 40, Sizes.parse("x", "1 TiB"));
    ConfigException e = assertThrows(ConfigException.class, () -> Sizes.parse("retention-cap-bytes", "-1"));
    assertTrue(e.getMessage().startsWith("retention-cap-bytes: '-1' (expected: a byte size"), e.getMessage());
    assertThrows(ConfigException.class, () -> Sizes.parse("x", "99999999999TiB"));
    assertThrows(ConfigException.class, () -> Sizes.parse("x", "5 parsecs"));
  }

  @Test
  void precedence_flagOverEnvOverFileOverDefault() throws Exception {
    Path file = dir.resolve("gpumemd.properties");
    Files.writeString(file, "retention-cap-bytes = 1GiB\nhost-devices = 3\nmetrics-port = 1234\n");
    ServerConfig c = load(Map.of("GPUMEMD_CONFIG", file.toString(), "GPUMEMD_HOST_DEVICES", "5",
        "GPUMEMD_RETENTION_CAP_BYTES", "256MiB"), "--retention-cap-bytes", "128MiB");
    assertEquals(128L << 20, c.retentionCapBytes());
    assertEquals(5, c.hostDevices());
    assertEquals(1234, c.metricsPort());
    assertEquals("flag", c.sources().get("retention-cap-bytes"));
    assertEquals("env GPUMEMD_HOST_DEVICES", c.sources().get("host-devices"));
    assertEquals("file", c.sources().get("metrics-port"));
    assertTrue(c.describe().contains("retention-cap-bytes = 134217728  [flag]"), c.describe());
  }

  @Test
  void quotaOverrides_comeFromTheFile() throws Exception {
    Path file = dir.resolve("q.properties");
    Files.writeString(file, "quota.trainer.max-leased-bytes=8GiB\nquota.trainer.max-leases=10\nquota-max-leases=100\n");
    ServerConfig c = load(Map.of(), "--config=" + file);
    assertEquals(new Quota(8L << 30, 10), c.quotaOverrides().get("trainer"));
    assertEquals(new Quota(0, 100), c.defaultQuota());
    Files.writeString(file, "quota.trainer.max-bytes=1\n");
    rejects("unknown quota field 'quota.trainer.max-bytes'", Map.of(), "--config", file.toString());
  }

  @Test
  void listeners_canBeTurnedOffButNotBoth() {
    ServerConfig c = load(Map.of(), "--socket", "none", "--listen", "0.0.0.0:7000");
    assertNull(c.socket());
    assertEquals(7000, c.listenPort());
    assertEquals("", load(Map.of(), "--listen", "none").listenHost());
    rejects("socket/listen: both 'none' (expected: at least one listener)", Map.of(),
        "--socket", "none", "--listen", "none");
  }

  @Test
  void badValues_areNamedWithWhatWasExpected() {
    rejects("backend: gpu (expected: auto, host or cuda)", Map.of(), "--backend", "gpu");
    rejects("listen: localhost (expected: HOST:PORT", Map.of(), "--listen", "localhost");
    rejects("listen: 70000 (expected: an integer in [0, 65535])", Map.of(), "--listen", "h:70000");
    rejects("metrics-port: 'abc' (expected: an integer)", Map.of("GPUMEMD_METRICS_PORT", "abc"));
    rejects("device-limit-fraction: 1.5 (expected: a number in (0, 1])", Map.of(), "--device-limit-fraction", "1.5");
    rejects("host-device-bytes: 1MiB (expected: at least 2MiB", Map.of(), "--host-device-bytes", "1MiB");
    rejects("log-format: xml (expected: plain or json)", Map.of(), "--log-format", "xml");
    rejects("--socket: no value", Map.of(), "--socket");
    rejects("flag: --sockets", Map.of(), "--sockets", "x");
    rejects("config: /nonexistent.properties (expected: a readable properties file", Map.of(),
        "--config", "/nonexistent.properties");
  }

  @Test
  void deviceLimit_isAFractionOfCapacityUnlessGivenInBytes() {
    assertEquals((long) (0.9 * (1L << 30)) & -512L, load(Map.of()).deviceLimit(1L << 30));
    assertEquals(100L << 20, load(Map.of(), "--device-limit-bytes", "100MiB").deviceLimit(1L << 30));
    assertEquals(1L << 30, load(Map.of(), "--device-limit-bytes", "100GiB").deviceLimit(1L << 30));
  }
}
