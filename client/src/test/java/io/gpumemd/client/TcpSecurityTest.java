package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestCertificates;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The client's TLS and bearer tokens against a real daemon on loopback TCP: who the daemon
 * takes each caller for (ListSessions' tenant and peer), what each may do (admin verbs,
 * other tenants' sessions), and what it refuses. Certificates come from openssl.
 */
class TcpSecurityTest {
  private static final String ADMIN_TOKEN = "ops-token-0123456789abcdef";
  private static final String TEAM_A_TOKEN = "team-a-token-0123456789abc";
  private static final String TEAM_B_TOKEN = "team-b-token-0123456789abc";

  @TempDir
  static Path pkiDir;
  static TestCertificates pki;

  @TempDir
  Path dir;

  @BeforeAll
  static void certificates() {
    pki = TestCertificates.create(pkiDir);
    pki.client("worker-a", "/O=Team A/CN=worker-a");
    pki.client("ops", "/CN=ops");
  }

  private static TestDaemon tlsDaemon(boolean mutual, String... more) {
    List<String> flags = new ArrayList<>(pki.serverFlags(mutual));
    flags.addAll(List.of(more));
    return TestDaemon.start(flags.toArray(String[]::new));
  }

  private static GpuMemClient.Builder client(TestDaemon daemon) {
    return GpuMemClient.builder(daemon.tcpTarget()).clientCacheBytes(0);
  }

  private static List<SessionInfo> sessions(Channels.Connection c) {
    return AdminGrpc.newBlockingStub(c.channel()).listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList();
  }

  private static Status.Code trim(Channels.Connection c) {
    try {
      AdminGrpc.newBlockingStub(c.channel()).trim(TrimRequest.newBuilder().setKeepBytes(0).build());
      return Status.Code.OK;
    } catch (StatusRuntimeException e) {
      return e.getStatus().getCode();
    }
  }

  private Path tokensFile(String text) throws Exception {
    Path file = dir.resolve("tokens");
    Path next = dir.resolve("tokens.next");
    Files.writeString(next, text);
    Files.setPosixFilePermissions(next, PosixFilePermissions.fromString("rw-------"));
    // renamed over the old file, as an editor or a Secret update does
    Files.move(next, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    return file;
  }

  // --- TLS ------------------------------------------------------------------------------

  @Test
  void tls_clientTrustingTheCa_leasesAndReleases() {
    try (TestDaemon daemon = tlsDaemon(false);
         GpuMemClient c = client(daemon).tls(pki.caCert()).connect()) {
      try (Lease lease = c.lease(0, 1 << 20)) {
        assertEquals(1 << 20, lease.sizeBytes());
        assertEquals(1L << 20, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES));
      }
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES) != 0 && System.nanoTime() < deadline) {
        Thread.onSpinWait();
      }
      assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES), "released");
    }
  }

  @Test
  void tls_plaintextClient_isRefused() {
    try (TestDaemon daemon = tlsDaemon(false)) {
      GpuMemException e = assertThrows(GpuMemException.class, () -> client(daemon).connect().close());
      assertEquals(Status.Code.UNAVAILABLE, e.code(), e.getMessage());
    }
  }

  @Test
  void tls_clientTrustingAnotherCa_isRefused() {
    TestCertificates other = TestCertificates.create(dir);
    try (TestDaemon daemon = tlsDaemon(false)) {
      GpuMemException e = assertThrows(GpuMemException.class, () -> client(daemon).tls(other.caCert()).connect().close());
      assertEquals(Status.Code.UNAVAILABLE, e.code(), e.getMessage());
    }
  }

  @Test
  void tls_isNeverUsedOnTheUnixSocket() {
    try (TestDaemon daemon = tlsDaemon(false)) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> GpuMemClient.builder(daemon.unixTarget()).tls(pki.caCert()).connect());
      assertTrue(e.getMessage().contains("is a Unix socket, which is never TLS"), e.getMessage());
    }
  }

  // --- mutual TLS -------------------------------------------------------------------------

  @Test
  void mutualTls_clientWithoutCertificate_isRefused() {
    try (TestDaemon daemon = tlsDaemon(true)) {
      GpuMemException e = assertThrows(GpuMemException.class, () -> client(daemon).tls(pki.caCert()).connect().close());
      assertEquals(Status.Code.UNAVAILABLE, e.code(), e.getMessage());
    }
  }

  @Test
  void mutualTls_certificateNamesTheTenant_andOnlyAnAdminCnMayTrim() {
    try (TestDaemon daemon = tlsDaemon(true, "--admin-cert-cn", "ops");
         GpuMemClient worker = client(daemon).clientName("w").tls(pki.caCert(), pki.cert("worker-a"), pki.key("worker-a")).connect();
         Channels.Connection ops = Channels.open(daemon.tcpTarget(),
             new Channels.Security(pki.caCert(), pki.cert("ops"), pki.key("ops"), null))) {
      List<SessionInfo> own = sessions(worker.connection());
      assertEquals(1, own.size(), own.toString());
      assertEquals("cert:worker-a", own.get(0).getTenant());
      assertTrue(own.get(0).getPeer().startsWith("cert CN=worker-a,O=Team A"), own.get(0).getPeer());
      assertEquals(Status.Code.PERMISSION_DENIED, trim(worker.connection()));

      assertEquals(Status.Code.OK, trim(ops));
      assertEquals(List.of("cert:worker-a"), sessions(ops).stream().map(SessionInfo::getTenant).toList(),
          "an admin sees every tenant's sessions");
    }
  }

  // --- bearer tokens ----------------------------------------------------------------------

  @Test
  void tokens_adminMayTrim_userMayNot_andTenantsSeeOnlyTheirOwnSessions() throws Exception {
    Path tokens = tokensFile(ADMIN_TOKEN + " ops admin\n" + TEAM_A_TOKEN + " team-a\n" + TEAM_B_TOKEN + " team-b user\n");
    try (TestDaemon daemon = tlsDaemon(false, "--tokens-file", tokens.toString());
         GpuMemClient a = client(daemon).tls(pki.caCert()).bearerToken(TEAM_A_TOKEN).clientName("a").connect();
         GpuMemClient b = client(daemon).tls(pki.caCert()).bearerToken(TEAM_B_TOKEN).clientName("b").connect();
         Channels.Connection ops = Channels.open(daemon.tcpTarget(), new Channels.Security(pki.caCert(), null, null, ADMIN_TOKEN))) {
      List<SessionInfo> seenByA = sessions(a.connection());
      assertEquals(List.of(a.sessionId()), seenByA.stream().map(SessionInfo::getSessionId).toList());
      assertEquals("token:team-a", seenByA.get(0).getTenant());
      assertEquals("token 'team-a'", seenByA.get(0).getPeer());
      assertEquals(List.of(b.sessionId()), sessions(b.connection()).stream().map(SessionInfo::getSessionId).toList());

      StatusRuntimeException foreign = assertThrows(StatusRuntimeException.class, () -> AllocatorGrpc
          .newBlockingStub(b.connection().channel())
          .lease(LeaseRequest.newBuilder().setSessionId(a.sessionId()).setDevice(0).setSizeBytes(4096).build()));
      assertEquals(Status.Code.NOT_FOUND, foreign.getStatus().getCode(), "another tenant's session does not exist for b");

      assertEquals(Status.Code.PERMISSION_DENIED, trim(a.connection()));
      assertEquals(Status.Code.OK, trim(ops));
      assertEquals(2, sessions(ops).size(), "the admin token sees both tenants");
    }
  }

  @Test
  void tokens_unknownToken_isUnauthenticated() throws Exception {
    Path tokens = tokensFile(TEAM_A_TOKEN + " team-a\n");
    try (TestDaemon daemon = TestDaemon.start("--tokens-file", tokens.toString())) {
      GpuMemException e = assertThrows(GpuMemException.class,
          () -> client(daemon).bearerToken(TEAM_A_TOKEN + "x").connect().close());
      assertEquals(Status.Code.UNAUTHENTICATED, e.code());
      assertEquals("unknown bearer token", e.serverMessage());
      assertEquals(0, daemon.server().registry().sessionCount(), "no session was opened");
    }
  }

  @Test
  void tokens_onTheUnixSocket_actAsTheTokensTenant() throws Exception {
    Path tokens = tokensFile(TEAM_A_TOKEN + " team-a\n");
    try (TestDaemon daemon = TestDaemon.start("--tokens-file", tokens.toString());
         GpuMemClient c = GpuMemClient.builder(daemon.unixTarget()).bearerToken(TEAM_A_TOKEN).connect()) {
      SessionInfo s = sessions(c.connection()).get(0);
      assertEquals("token:team-a", s.getTenant());
    }
  }

  @Test
  void tokens_fileEditedWhileRunning_newTokenWorks_removedTokenIsRefused() throws Exception {
    Path tokens = tokensFile(TEAM_A_TOKEN + " team-a\n");
    try (TestDaemon daemon = TestDaemon.start("--tokens-file", tokens.toString())) {
      client(daemon).bearerToken(TEAM_A_TOKEN).connect().close();
      tokensFile(TEAM_B_TOKEN + " team-b\n");
      // the daemon looks at the file at most once a second
      Status.Code removed = awaitCode(() -> connectCode(daemon, TEAM_A_TOKEN), Status.Code.UNAUTHENTICATED);
      assertEquals(Status.Code.UNAUTHENTICATED, removed, "the removed token is refused");
      assertEquals(Status.Code.OK, connectCode(daemon, TEAM_B_TOKEN), "the new token works");
    }
  }

  private static Status.Code connectCode(TestDaemon daemon, String token) {
    try (GpuMemClient c = client(daemon).bearerToken(token).keepAlive(false).connect()) {
      return Status.Code.OK;
    } catch (GpuMemException e) {
      return e.code();
    }
  }

  /** Polls until the call answers {@code expected} or 5 s pass; returns the last answer. */
  private static Status.Code awaitCode(Supplier<Status.Code> call, Status.Code expected) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    Status.Code last = call.get();
    while (last != expected && System.nanoTime() < deadline) {
      Thread.sleep(50);
      last = call.get();
    }
    return last;
  }
}
