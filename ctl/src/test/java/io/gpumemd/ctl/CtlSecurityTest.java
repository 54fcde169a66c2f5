package io.gpumemd.ctl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.server.testing.TestCertificates;
import io.gpumemd.server.testing.TestDaemon;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** gpumemctl's --token-file and TLS options against a daemon that requires them. */
class CtlSecurityTest {
  private static final String ADMIN_TOKEN = "ops-token-0123456789abcdef";
  private static final String USER_TOKEN = "team-a-token-0123456789abc";

  @TempDir
  Path dir;

  private Path secret(String name, String text) throws Exception {
    Path file = Files.writeString(dir.resolve(name), text);
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-------"));
    return file;
  }

  private TestDaemon tokenDaemon() throws Exception {
    Path tokens = secret("tokens", ADMIN_TOKEN + " ops admin\n" + USER_TOKEN + " team-a\n");
    return TestDaemon.start("--tokens-file", tokens.toString());
  }

  @Test
  void tokenFile_adminTokenMayTrim_userTokenMayNot() throws Exception {
    Path admin = secret("admin.token", "# the ops token\n" + ADMIN_TOKEN + "\n");
    Path user = secret("user.token", USER_TOKEN + "\n");
    try (TestDaemon daemon = tokenDaemon()) {
      CtlRun ok = CtlRun.of("--target", daemon.tcpTarget(), "--token-file", admin.toString(), "trim", "--keep-bytes", "0");
      assertEquals(0, ok.code(), ok.err());

      CtlRun denied = CtlRun.of("trim", "--keep-bytes", "0", "--target", daemon.tcpTarget(), "--token-file", user.toString());
      assertEquals(1, denied.code(), denied.out());
      assertTrue(denied.err().startsWith("gpumemctl: PERMISSION_DENIED: Trim"), denied.err());
    }
  }

  @Test
  void tokenFile_fromTheEnvironment_showsOnlyThatTenantsSessions() throws Exception {
    Path user = secret("user.token", USER_TOKEN + "\n");
    try (TestDaemon daemon = tokenDaemon();
         GpuMemClient teamA = GpuMemClient.builder(daemon.unixTarget()).bearerToken(USER_TOKEN).clientName("team-a-worker").connect();
         GpuMemClient local = GpuMemClient.builder(daemon.unixTarget()).clientName("local-worker").connect()) {
      CtlRun run = CtlRun.withEnv(Map.of("GPUMEMD_TARGET", daemon.unixTarget(), "GPUMEMD_TOKEN_FILE", user.toString()),
          "--json", "sessions");
      assertEquals(0, run.code(), run.err());
      assertTrue(run.out().contains("\"tenant\": \"token:team-a\""), run.out());
      assertTrue(run.out().contains(teamA.sessionId()), run.out());
      assertFalse(run.out().contains(local.sessionId()), "the socket peer's own session is another tenant's: " + run.out());
    }
  }

  @Test
  void tokenFile_withAnUnknownToken_isUnauthenticated() throws Exception {
    Path wrong = secret("wrong.token", "not-a-listed-token-0123456789\n");
    try (TestDaemon daemon = tokenDaemon()) {
      CtlRun run = CtlRun.of("--target", daemon.tcpTarget(), "--token-file", wrong.toString(), "devices");
      assertEquals(1, run.code());
      assertEquals("gpumemctl: UNAUTHENTICATED: unknown bearer token\n", run.err());
    }
  }

  @Test
  void tokenFile_thatCannotBeRead_isAUsageError() {
    Path missing = dir.resolve("missing.token");
    CtlRun run = CtlRun.of("--token-file", missing.toString(), "devices");
    assertEquals(2, run.code());
    assertTrue(run.err().startsWith("gpumemctl: --token-file: '" + missing
        + "' (expected: a readable file holding a bearer token; there is no such file)"), run.err());
  }

  @Test
  void tls_mutual_healthAndAdminByCertificate() {
    TestCertificates pki = TestCertificates.create(dir);
    pki.client("ops", "/CN=ops");
    pki.client("worker", "/CN=worker");
    List<String> flags = new ArrayList<>(pki.serverFlags(true));
    flags.addAll(List.of("--admin-cert-cn", "ops"));
    try (TestDaemon daemon = TestDaemon.start(flags.toArray(String[]::new))) {
      String ca = pki.caCert().toString();
      CtlRun health = CtlRun.of("--target", daemon.tcpTarget(), "--tls-ca", ca,
          "--tls-cert", pki.cert("worker").toString(), "--tls-key", pki.key("worker").toString(), "health");
      assertEquals(0, health.code(), health.err());

      CtlRun denied = CtlRun.of("--target", daemon.tcpTarget(), "--tls-ca", ca,
          "--tls-cert", pki.cert("worker").toString(), "--tls-key", pki.key("worker").toString(), "trim", "--keep-bytes", "0");
      assertEquals(1, denied.code());
      assertTrue(denied.err().contains("PERMISSION_DENIED"), denied.err());

      CtlRun trim = CtlRun.withEnv(Map.of("GPUMEMD_TLS_CA", ca, "GPUMEMD_TLS_CERT", pki.cert("ops").toString(),
          "GPUMEMD_TLS_KEY", pki.key("ops").toString()), "--target", daemon.tcpTarget(), "trim", "--keep-bytes", "0");
      assertEquals(0, trim.code(), trim.err());

      CtlRun noCert = CtlRun.of("--target", daemon.tcpTarget(), "--tls-ca", ca, "devices");
      assertEquals(1, noCert.code());
      assertTrue(noCert.err().startsWith("gpumemctl: UNAVAILABLE"), noCert.err());
    }
  }

  @Test
  void tlsCert_withoutItsKey_isAUsageError() {
    CtlRun run = CtlRun.of("--tls-ca", "/ca.pem", "--tls-cert", "/c.pem", "devices");
    assertEquals(2, run.code());
    assertTrue(run.err().startsWith("gpumemctl: --tls-cert: '/c.pem' (expected: together with --tls-key)"), run.err());
  }
}
