package io.gpumemd.server.config;

import java.nio.file.Path;
import java.util.Set;

/**
 * How callers prove who they are beyond the kernel's word; part of {@link ServerConfig}. The
 * files were readable and well-formed when the configuration was parsed.
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

  public boolean tls() {
    return tlsCert != null;
  }

  public boolean mutualTls() {
    return tlsClientCa != null;
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
