package io.gpumemd.server.auth;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Set;
import javax.security.auth.x500.X500Principal;
import org.junit.jupiter.api.Test;

/** How a client certificate's subject becomes a caller. */
class CertificatePeersTest {
  private final CertificatePeers peers = new CertificatePeers(Set.of("ops"));

  @Test
  void subjectWithCn_namesTheTenantByItsCn() {
    Caller c = peers.callerOf(new X500Principal("CN=worker-a, O=Team A, C=DE"), "tcp 10.0.0.5:4000");
    assertEquals("cert:worker-a", c.tenant());
    assertEquals("cert CN=worker-a,O=Team A,C=DE", c.principal());
    assertEquals("tcp 10.0.0.5:4000", c.origin());
    assertFalse(c.admin());
  }

  @Test
  void adminCn_isAdmin_andAnOrganisationNamedLikeItIsNot() {
    assertTrue(peers.callerOf(new X500Principal("CN=ops,O=x"), "tcp a").admin());
    assertFalse(peers.callerOf(new X500Principal("CN=worker,O=ops"), "tcp a").admin());
    assertFalse(peers.callerOf(new X500Principal("O=ops"), "tcp a").admin());
  }

  @Test
  void subjectWithoutCn_namesTheTenantByTheWholeDn() {
    Caller c = peers.callerOf(new X500Principal("OU=batch, O=Team A"), "tcp a");
    assertEquals("cert:OU=batch,O=Team A", c.tenant());
  }
}
