package io.gpumemd.server.config;

import io.gpumemd.server.auth.BearerTokens;
import io.gpumemd.server.auth.PemFiles;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.file.Path;
import java.security.PrivateKey;
import java.security.cert.X509Certificate;
import java.util.function.Supplier;

/**
 * Checks what a configuration names on this host, after it was built from the options: the TLS
 * files and the tokens file are readable and well-formed, the admin group exists, and a TCP
 * address without TLS is loopback. A wrong file is so a configuration error at start, reported with the other
 * problems of the options, never a failure at the first handshake or call. The listeners read
 * the files again, and the daemon looks the admin group up again, when they start
 * ({@code GpumemdServer}).
 *
 * <p>This is the configuration's only I/O besides the {@code --config} file: the option
 * records ({@link ServerConfig#from}) read nothing but the options. Stateless; thread-safe.
 */
final class HostChecks {
  private HostChecks() {}

  /** Records each problem in {@code s}, named after the option that gave the file, group or address. */
  static void check(ServerConfig config, Settings s) {
    tlsAndTokenFiles(config.security(), s);
    if (!config.tenancy().adminGroup().isEmpty() && config.tenancy().adminGid() < 0) {
      s.problem(s.get("admin-group"), "a group name from /etc/group or a numeric gid");
    }
    ListenerConfig listeners = config.listeners();
    boolean tcp = listeners.tcpEnabled() && s.valid("listen");
    if (tcp && !config.security().tls() && !config.security().insecureTcp() && !isLoopback(listeners.listenHost())) {
      Setting listen = s.get("listen");
      s.problem("listen: '" + listen.value() + "' is not a loopback address and has no TLS (expected: "
          + "--tls-cert and --tls-key for TLS, or --insecure-tcp to accept unidentified remote peers in "
          + "plaintext, or a loopback address such as 127.0.0.1) [" + listen.where() + "]");
    }
  }

  private static void tlsAndTokenFiles(TcpSecurityConfig security, Settings s) {
    Path cert = security.tlsCert();
    Path key = security.tlsKey();
    if (cert != null && key != null) {
      X509Certificate leaf = read(s, "tls-cert", () -> PemFiles.certificates(cert).get(0));
      PrivateKey privateKey = read(s, "tls-key", () -> PemFiles.privateKey(key));
      if (leaf != null && privateKey != null) {
        read(s, "tls-key", () -> {
          PemFiles.checkPair(leaf, privateKey);
          return null;
        });
      }
    }
    if (security.tlsClientCa() != null) {
      read(s, "tls-client-ca", () -> PemFiles.certificates(security.tlsClientCa()));
    }
    if (security.tokensFile() != null) {
      read(s, "tokens-file", () -> {
        BearerTokens.check(security.tokensFile());
        return null;
      });
    }
  }

  /** Runs a file check; its failure is a problem of the named option. */
  private static <T> T read(Settings s, String name, Supplier<T> check) {
    try {
      return check.get();
    } catch (IllegalArgumentException e) {
      s.problem(s.get(name), e.getMessage());
      return null;
    }
  }

  /**
   * True when every address the host names is a loopback address: only processes of this host
   * (of this network namespace) can connect, and {@link io.gpumemd.server.auth.LoopbackPeers}
   * identifies them. A name that does not resolve counts as remote.
   */
  static boolean isLoopback(String host) {
    try {
      InetAddress[] addresses = InetAddress.getAllByName(host);
      for (InetAddress a : addresses) {
        if (!a.isLoopbackAddress()) {
          return false;
        }
      }
      return addresses.length > 0;
    } catch (UnknownHostException e) {
      return false;
    }
  }
}
