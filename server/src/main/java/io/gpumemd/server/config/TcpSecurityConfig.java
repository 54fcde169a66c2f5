package io.gpumemd.server.config;

import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * How callers prove who they are beyond the kernel's word; part of {@link ServerConfig}. The
 * files were readable and well-formed when the configuration was parsed ({@link HostChecks}).
 *
 * @param tlsCert the TCP listener's certificate chain (PEM), or null for plaintext TCP
 * @param tlsKey its PKCS#8 private key (PEM), or null
 * @param tlsClientCa the CA that must have signed every client's certificate (mutual TLS), or
 *     null for no client certificates
 * @param adminCertCommonNames client certificate CNs that may use the admin verbs
 * @param tokensFile the bearer tokens ({@code TOKEN TENANT [admin|user]} lines), or null
 * @param insecureTcp unidentified TCP peers are served as the shared 'anonymous' tenant
 */
public record TcpSecurityConfig(
    Path tlsCert,
    Path tlsKey,
    Path tlsClientCa,
    Set<String> adminCertCommonNames,
    Path tokensFile,
    boolean insecureTcp) {

  public static final TcpSecurityConfig NONE = new TcpSecurityConfig(null, null, null, Set.of(), null, false);

  public TcpSecurityConfig {
    adminCertCommonNames = Set.copyOf(adminCertCommonNames);
  }

  /**
   * Reads the TLS, token and exposure options and checks that they fit together; a problem is
   * recorded in {@code s}. The files themselves are read by {@link HostChecks}.
   */
  static TcpSecurityConfig from(Settings s, ListenerConfig listeners) {
    boolean insecure = s.choice("insecure-tcp", List.of("false", "true")).equals("true");
    Path cert = s.path("tls-cert");
    Path key = s.path("tls-key");
    Path clientCa = s.path("tls-client-ca");
    Path tokens = s.path("tokens-file");
    Set<String> adminCns = new TreeSet<>();
    for (String cn : s.text("admin-cert-cn").split(",")) {
      if (!cn.isBlank()) {
        adminCns.add(cn.trim());
      }
    }
    if (cert != null && key == null) {
      s.problem(s.get("tls-cert"), "a certificate with its key; --tls-key is missing");
    } else if (key != null && cert == null) {
      s.problem(s.get("tls-key"), "a key with its certificate; --tls-cert is missing");
    }
    if (clientCa != null && cert == null) {
      s.problem(s.get("tls-client-ca"), "client certificates need TLS; --tls-cert and --tls-key are missing");
    }
    if (!adminCns.isEmpty() && clientCa == null) {
      s.problem(s.get("admin-cert-cn"), "names of client certificates; without --tls-client-ca there are none");
    }
    if (cert != null && !listeners.tcpEnabled() && s.valid("listen")) {
      s.problem(s.get("tls-cert"), "TLS for the TCP listener; --listen is 'none'");
    }
    return new TcpSecurityConfig(cert, key, clientCa, adminCns, tokens, insecure);
  }

  public boolean tls() {
    return tlsCert != null;
  }

  public boolean mutualTls() {
    return tlsClientCa != null;
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("tls-cert", tlsCert == null ? "(none: plaintext TCP)" : tlsCert);
    values.put("tls-key", tlsKey == null ? "(none)" : tlsKey);
    values.put("tls-client-ca", tlsClientCa == null ? "(none: no client certificates)" : tlsClientCa);
    values.put("admin-cert-cn", adminCertCommonNames.isEmpty() ? "(none)" : String.join(",", adminCertCommonNames));
    values.put("tokens-file", tokensFile == null ? "(none)" : tokensFile);
    values.put("insecure-tcp", insecureTcp);
  }

  /** One phrase for the start log. */
  public String describe() {
    String transport = !tls() ? "plaintext"
        : mutualTls() ? "TLS, client certificates signed by " + tlsClientCa + " required"
            + (adminCertCommonNames.isEmpty() ? "" : ", admin CNs " + adminCertCommonNames)
        : "TLS";
    return transport + (tokensFile == null ? "" : ", bearer tokens from " + tokensFile)
        + (insecureTcp ? ", unidentified peers served as 'anonymous' (--insecure-tcp)" : "");
  }
}
