package io.gpumemd.server.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.TestCertificates;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The TCP exposure rule and the TLS and token options: what the daemon refuses at start, and
 * with which message. The files are real (openssl), so a check that reads them can fail.
 */
class TcpSecurityOptionsTest {
  @TempDir
  static Path pkiDir;
  static TestCertificates pki;

  @TempDir
  Path dir;

  @BeforeAll
  static void certificates() {
    pki = TestCertificates.create(pkiDir);
    pki.client("other", "/CN=other");
  }

  private static ServerConfig load(String... args) {
    return ServerOptions.parse(args, Map.of());
  }

  private static String rejected(String... args) {
    return assertThrows(ConfigException.class, () -> ServerOptions.parse(args, Map.of())).getMessage();
  }

  private static String[] withTls(String... args) {
    List<String> all = new ArrayList<>(pki.serverFlags(false));
    all.addAll(List.of(args));
    return all.toArray(String[]::new);
  }

  @Test
  void tcp_isOffByDefault_theUnixSocketIsTheListener() {
    ServerConfig c = load();
    assertFalse(c.listeners().tcpEnabled());
    assertEquals(Path.of("/tmp/gpumemd.sock"), c.listeners().socket());
    assertEquals(TcpSecurityConfig.NONE, c.security());
  }

  @Test
  void nonLoopbackListen_withoutTls_isRefused_namingTheWaysOut() {
    String message = rejected("--listen", "0.0.0.0:50051");
    assertEquals("listen: '0.0.0.0:50051' is not a loopback address and has no TLS (expected: --tls-cert and "
        + "--tls-key for TLS, or --insecure-tcp to accept unidentified remote peers in plaintext, or a loopback "
        + "address such as 127.0.0.1) [flag --listen]", message);
    assertTrue(rejected("--listen", "[::]:7000").contains("listen: '[::]:7000' is not a loopback address"));
  }

  @Test
  void nonLoopbackListen_fromTheEnvironment_namesTheVariable() {
    ConfigException e = assertThrows(ConfigException.class,
        () -> ServerOptions.parse(new String[0], Map.of("GPUMEMD_LISTEN", "0.0.0.0:50051")));
    assertTrue(e.getMessage().endsWith("[env GPUMEMD_LISTEN]"), e.getMessage());
  }

  @Test
  void nonLoopbackListen_isAllowedWithInsecureTcp_orWithTls() {
    ServerConfig insecure = load("--listen", "0.0.0.0:50051", "--insecure-tcp");
    assertTrue(insecure.security().insecureTcp());
    assertFalse(insecure.security().tls());
    assertTrue(ServerOptions.parse(new String[] {"--listen", "0.0.0.0:1"},
        Map.of("GPUMEMD_INSECURE_TCP", "true")).security().insecureTcp(), "from the environment too");
    ServerConfig tls = load(withTls("--listen", "0.0.0.0:50051"));
    assertTrue(tls.security().tls());
    assertEquals(pki.serverCert(), tls.security().tlsCert());
    assertFalse(tls.security().insecureTcp());
  }

  @Test
  void loopbackListen_needsNeitherTlsNorInsecureTcp() {
    for (String listen : List.of("127.0.0.1:0", "127.0.0.2:7000", "[::1]:7000", "localhost:7000")) {
      assertTrue(load("--listen", listen).listeners().tcpEnabled(), listen);
    }
    assertTrue(load(withTls("--listen", "127.0.0.1:0")).security().tls(), "TLS on loopback is allowed");
  }

  @Test
  void tlsFlags_mustComeInPairs_andNeedAListener() {
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-cert", pki.serverCert().toString())
        .contains("tls-cert: '" + pki.serverCert() + "' (expected: a certificate with its key; --tls-key is missing)"));
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-key", pki.serverKey().toString())
        .contains("(expected: a key with its certificate; --tls-cert is missing)"));
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-client-ca", pki.caCert().toString())
        .contains("tls-client-ca: '" + pki.caCert() + "' (expected: client certificates need TLS"));
    assertTrue(rejected(withTls("--listen", "127.0.0.1:0", "--admin-cert-cn", "ops"))
        .contains("admin-cert-cn: 'ops' (expected: names of client certificates; without --tls-client-ca there are none)"));
    assertTrue(rejected(withTls()).contains("tls-cert: '" + pki.serverCert()
        + "' (expected: TLS for the TCP listener; --listen is 'none')"));
  }

  @Test
  void mutualTls_andAdminCommonNames_areParsed() {
    List<String> args = new ArrayList<>(pki.serverFlags(true));
    args.addAll(List.of("--listen", "0.0.0.0:50051", "--admin-cert-cn", "ops, root-ca-admin ,"));
    TcpSecurityConfig s = load(args.toArray(String[]::new)).security();
    assertTrue(s.mutualTls());
    assertEquals(Set.of("ops", "root-ca-admin"), s.adminCertCommonNames());
  }

  @Test
  void tlsFiles_areReadAtStart_withPreciseErrors() throws Exception {
    Path missing = dir.resolve("missing.pem");
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-cert", missing.toString(), "--tls-key", pki.serverKey().toString())
        .contains("tls-cert: '" + missing + "' (expected: a PEM certificate file; there is no such file) [flag --tls-cert]"));

    Path notPem = Files.writeString(dir.resolve("notes.txt"), "hello\n");
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-cert", notPem.toString(), "--tls-key", pki.serverKey().toString())
        .contains("tls-cert: '" + notPem + "' (expected: a PEM certificate file"));

    // a certificate where the key belongs
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-cert", pki.serverCert().toString(), "--tls-key", pki.serverCert().toString())
        .contains("(expected: a PEM private key file (-----BEGIN PRIVATE KEY-----); none found in it)"));

    Path traditional = Files.writeString(dir.resolve("ec.key"),
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA==\n-----END EC PRIVATE KEY-----\n");
    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-cert", pki.serverCert().toString(), "--tls-key", traditional.toString())
        .contains("this one is 'EC PRIVATE KEY' (convert it with 'openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8')"));

    assertTrue(rejected("--listen", "127.0.0.1:0", "--tls-cert", pki.serverCert().toString(), "--tls-key", pki.key("other").toString())
        .contains("tls-key: '" + pki.key("other") + "' (expected: the private key of the certificate in tls-cert "
            + "(CN=localhost); this key does not match it)"));

    List<String> args = new ArrayList<>(pki.serverFlags(false));
    args.addAll(List.of("--listen", "127.0.0.1:0", "--tls-client-ca", missing.toString()));
    assertTrue(rejected(args.toArray(String[]::new)).contains("tls-client-ca: '" + missing + "' (expected: a PEM certificate file; there is no such file)"));
  }

  @Test
  void tokensFile_isCheckedAtStart_andErrorsNeverQuoteAToken() throws Exception {
    Path good = Files.writeString(dir.resolve("tokens"), "# ops\n0123456789abcdef0123 ops admin\nfedcba9876543210fedc team-a\n");
    assertEquals(good, load("--tokens-file", good.toString()).security().tokensFile());

    Path missing = dir.resolve("nope");
    assertTrue(rejected("--tokens-file", missing.toString()).contains("tokens-file: '" + missing
        + "' (expected: a tokens file (lines 'TOKEN TENANT [admin|user]'); there is no such file) [flag --tokens-file]"));

    Path shortToken = Files.writeString(dir.resolve("short"), "s3cret team-a\n");
    String message = rejected("--tokens-file", shortToken.toString());
    assertTrue(message.contains("(expected: tokens of at least 16 characters (e.g. from 'openssl rand -hex 32'); "
        + "the token on line 1 has 6)"), message);
    assertFalse(message.contains("s3cret"), "a token never appears in a message: " + message);

    Path badRole = Files.writeString(dir.resolve("role"), "0123456789abcdef0123 team-a root\n");
    assertTrue(rejected("--tokens-file", badRole.toString()).contains("a role 'admin' or 'user' on line 1; found 'root'"));

    Path duplicate = Files.writeString(dir.resolve("dup"), "0123456789abcdef0123 a\n\n0123456789abcdef0123 b\n");
    assertTrue(rejected("--tokens-file", duplicate.toString()).contains("line 3 repeats the token of line 1"));
  }

  @Test
  void defaults_haveNoTlsNoTokens() {
    TcpSecurityConfig s = load("--listen", "127.0.0.1:0").security();
    assertNull(s.tlsCert());
    assertNull(s.tokensFile());
    assertFalse(s.insecureTcp());
  }
}
