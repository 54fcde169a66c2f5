package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.Grpc;
import io.grpc.ServerTransportFilter;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.security.cert.Certificate;
import java.security.cert.X509Certificate;
import java.util.List;
import java.util.Set;
import javax.naming.InvalidNameException;
import javax.naming.ldap.LdapName;
import javax.naming.ldap.Rdn;
import javax.net.ssl.SSLPeerUnverifiedException;
import javax.net.ssl.SSLSession;
import javax.security.auth.x500.X500Principal;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Identifies TLS peers by their client certificate, once per connection: the handshake (with
 * {@code --tls-client-ca}, which makes a certificate signed by that CA mandatory) has verified
 * the chain, so the leaf's subject names the caller. Tenant {@code cert:<CN>} (the whole subject
 * DN when it has no CN), principal {@code cert <subject DN>}, admin when the CN is one of
 * {@code --admin-cert-cn}. A connection without a peer certificate is left to the next filter
 * ({@link LoopbackPeers}).
 *
 * <p>Thread-safety: immutable; runs on the connection's event loop.
 */
public final class CertificatePeers extends ServerTransportFilter {
  private static final Logger log = LoggerFactory.getLogger(CertificatePeers.class);

  private final Set<String> adminCommonNames;

  public CertificatePeers(Set<String> adminCommonNames) {
    this.adminCommonNames = Set.copyOf(adminCommonNames);
  }

  @Override
  public Attributes transportReady(Attributes attributes) {
    SSLSession ssl = attributes.get(Grpc.TRANSPORT_ATTR_SSL_SESSION);
    if (ssl == null || attributes.get(Callers.PEER) != null) {
      return attributes;
    }
    Certificate[] chain;
    try {
      chain = ssl.getPeerCertificates();
    } catch (SSLPeerUnverifiedException e) {
      return attributes; // TLS without a client certificate
    }
    if (chain.length == 0 || !(chain[0] instanceof X509Certificate leaf)) {
      return attributes;
    }
    SocketAddress remote = attributes.get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR);
    String origin = "tcp " + (remote instanceof InetSocketAddress inet ? LoopbackPeers.hostPort(inet) : remote);
    Caller caller = callerOf(leaf.getSubjectX500Principal(), origin);
    log.debug("TLS connection from {}", caller);
    return attributes.toBuilder().set(Callers.PEER, caller).build();
  }

  Caller callerOf(X500Principal subject, String origin) {
    String dn = subject.getName(X500Principal.RFC2253);
    String cn = commonName(dn);
    boolean admin = cn != null && adminCommonNames.contains(cn);
    return new Caller("cert:" + (cn != null ? cn : dn), "cert " + dn, admin,
        Caller.UNKNOWN, Caller.UNKNOWN, Caller.UNKNOWN, origin);
  }

  /**
   * The subject's most specific CN, or null. LdapName indexes RDNs from the right of the RFC 2253
   * string, so the most specific (leftmost) comes last.
   */
  static String commonName(String rfc2253) {
    try {
      List<Rdn> rdns = new LdapName(rfc2253).getRdns();
      for (int i = rdns.size() - 1; i >= 0; i--) {
        Rdn rdn = rdns.get(i);
        if (rdn.getType().equalsIgnoreCase("CN")) {
          return rdn.getValue().toString();
        }
      }
    } catch (InvalidNameException e) {
      // not parseable as a DN: the whole DN names the tenant
    }
    return null;
  }
}
