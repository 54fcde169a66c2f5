package io.gpumemd.server.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A throwaway PKI made with the {@code openssl} command: a CA, a server certificate for
 * 127.0.0.1 and localhost, and client certificates by CN, all P-256 keys in PKCS#8 PEM (what
 * {@code openssl req -nodes} writes), valid for two days. Files live in the directory given;
 * the test deletes it.
 */
public final class TestCertificates {
  private final Path dir;

  private TestCertificates(Path dir) {
    this.dir = dir;
  }

  /** Creates the CA and the server certificate in {@code dir}. */
  public static TestCertificates create(Path dir) {
    TestCertificates pki = new TestCertificates(dir);
    pki.openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=gpumemd test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
    pki.issue("server", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
    return pki;
  }

  /** Issues a client certificate with the given subject ({@code /CN=worker-a/O=team}); returns its name. */
  public String client(String name, String subject) {
    issue(name, subject, "extendedKeyUsage=clientAuth\n");
    return name;
  }

  public Path caCert() {
    return dir.resolve("ca.pem");
  }

  public Path serverCert() {
    return dir.resolve("server.pem");
  }

  public Path serverKey() {
    return dir.resolve("server.key");
  }

  public Path cert(String name) {
    return dir.resolve(name + ".pem");
  }

  public Path key(String name) {
    return dir.resolve(name + ".key");
  }

  /** The daemon flags for TLS, plus mutual TLS when {@code mutual}. */
  public List<String> serverFlags(boolean mutual) {
    List<String> flags = new ArrayList<>(List.of("--tls-cert", serverCert().toString(), "--tls-key", serverKey().toString()));
    if (mutual) {
      flags.addAll(List.of("--tls-client-ca", caCert().toString()));
    }
    return flags;
  }

  private void issue(String name, String subject, String extensions) {
    try {
      Files.writeString(dir.resolve(name + ".ext"), extensions, StandardCharsets.US_ASCII);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", name + ".key", "-out", name + ".csr", "-subj", subject);
    openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext");
  }

  private void openssl(String... args) {
    List<String> command = new ArrayList<>(List.of("openssl"));
    command.addAll(List.of(args));
    try {
      Process p = new ProcessBuilder(command).directory(dir.toFile()).redirectErrorStream(true).start();
      String output = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      if (!p.waitFor(30, TimeUnit.SECONDS) || p.exitValue() != 0) {
        throw new IllegalStateException(String.join(" ", command) + " failed: " + output);
      }
    } catch (IOException e) {
      throw new UncheckedIOException("cannot run openssl (needed by the TLS tests)", e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }
}
