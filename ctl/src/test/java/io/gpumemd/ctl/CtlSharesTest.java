package io.gpumemd.ctl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Share;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.RevokeShareResponse;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code gpumemctl shares} and {@code revoke-share} against a live daemon with two tenants: this
 * process over the Unix socket (uid 0, an admin) and a bearer token's tenant (not one). A
 * tenant lists and revokes its own tokens only; an admin lists and revokes anyone's; a listing
 * shows ids, never tokens.
 */
class CtlSharesTest {
  private static final String USER_TOKEN = "team-a-token-0123456789abc";

  @TempDir
  Path dir;

  private TestDaemon daemon;
  private Path userTokenFile;

  @BeforeEach
  void start() throws Exception {
    Path tokens = secret("tokens", USER_TOKEN + " team-a\n");
    userTokenFile = secret("user.token", USER_TOKEN + "\n");
    // path segments: the token tenant maps its lease, and only a uid can receive descriptors
    daemon = TestDaemon.start("--tokens-file", tokens.toString(), "--host-segments", "path");
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  private Path secret(String name, String text) throws Exception {
    Path file = Files.writeString(dir.resolve(name), text);
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-------"));
    return file;
  }

  /** gpumemctl as uid 0 over the socket: an admin. */
  private CtlRun asRoot(String... args) {
    return CtlRun.of(concat(List.of("--target", daemon.unixTarget()), args));
  }

  /** gpumemctl as the token's tenant, token:team-a: not an admin. */
  private CtlRun asTeamA(String... args) {
    return CtlRun.of(concat(List.of("--target", daemon.tcpTarget(), "--token-file", userTokenFile.toString()), args));
  }

  private static String[] concat(List<String> first, String[] rest) {
    return java.util.stream.Stream.concat(first.stream(), java.util.Arrays.stream(rest)).toArray(String[]::new);
  }

  private static void assertOk(CtlRun r) {
    assertEquals(0, r.code(), () -> "exit code; stderr: " + r.err() + "\nstdout: " + r.out());
    assertEquals("", r.err(), "stderr");
  }

  private static ListSharesResponse json(CtlRun r) throws Exception {
    assertOk(r);
    ListSharesResponse.Builder b = ListSharesResponse.newBuilder();
    JsonFormat.parser().merge(r.out(), b);
    return b.build();
  }

  private static ShareInfo bySession(ListSharesResponse shares, String sessionId) {
    return shares.getSharesList().stream().filter(s -> s.getSessionId().equals(sessionId)).findFirst()
        .orElseThrow(() -> new AssertionError("no token of session " + sessionId + " in " + shares));
  }

  @Test
  void tenantSeesItsOwn_adminSeesAndRevokesAnyones_neverATokenShown() throws Exception {
    assertEquals("no live share tokens\n", asRoot("shares").out());
    try (GpuMemClient root = GpuMemClient.builder(daemon.unixTarget()).clientName("root-loader").connect();
         GpuMemClient teamA = GpuMemClient.builder(daemon.unixTarget()).bearerToken(USER_TOKEN)
             .clientName("team-a-producer").connect();
         Lease rootLease = root.lease(0, 4096);
         Lease teamLease = teamA.lease(0, 3 << 20)) {
      Share rootShare = rootLease.share();
      Share teamShare = teamLease.share(Duration.ofSeconds(600), true, 2);

      ListSharesResponse all = json(asRoot("--json", "shares"));
      assertEquals(2, all.getTotal());
      ShareInfo team = bySession(all, teamA.sessionId());
      ShareInfo own = bySession(all, root.sessionId());
      assertEquals("token:team-a", team.getTenant());
      assertEquals(teamLease.id(), team.getLeaseId());
      assertEquals(2, team.getMaxAttaches());
      assertTrue(team.getReadOnly());
      assertEquals("uid:0", own.getTenant());

      CtlRun table = asRoot("shares");
      assertOk(table);
      List<String> lines = table.out().lines().toList();
      assertEquals(3, lines.size(), table.out());
      assertTrue(lines.get(0).matches("SHARE ID\\s+TENANT\\s+SESSION\\s+CLIENT\\s+LEASE\\s+DEVICE\\s+SIZE\\s+HOLDS"
          + "\\s+ATTACHES\\s+EXPIRES IN\\s+RO"), lines.get(0));
      String teamRow = lines.stream().filter(l -> l.startsWith(team.getShareId())).findFirst().orElseThrow();
      assertTrue(teamRow.matches(team.getShareId() + "\\s+token:team-a\\s+" + teamA.sessionId()
          + "\\s+team-a-producer\\s+" + teamLease.id() + "\\s+0\\s+3\\.0 MiB\\s+2\\s+0/2\\s+\\S+\\s+yes"), teamRow);
      for (String token : List.of(rootShare.token(), teamShare.token())) {
        assertFalse(table.out().contains(token) || all.toString().contains(token), "a listing never shows a token");
      }

      // The token's tenant sees its own only, and may not name another.
      ListSharesResponse mine = json(asTeamA("--json", "shares"));
      assertEquals(List.of(team.getShareId()), mine.getSharesList().stream().map(ShareInfo::getShareId).toList());
      CtlRun denied = asTeamA("shares", "--tenant", "uid:0");
      assertEquals(1, denied.code(), denied.out());
      assertEquals("", denied.out());
      assertTrue(denied.err().startsWith("gpumemctl: PERMISSION_DENIED: listing another tenant's share tokens needs "
          + "an admin identity"), denied.err());
      CtlRun revokeDenied = asTeamA("revoke-share", own.getShareId(), "--tenant", "uid:0");
      assertEquals(1, revokeDenied.code());
      assertTrue(revokeDenied.err().startsWith("gpumemctl: PERMISSION_DENIED: revoking another tenant's share token"),
          revokeDenied.err());
      assertEquals(2, json(asRoot("--json", "shares")).getTotal(), "the refusals revoked nothing");

      // The admin revokes the team's token: the team's lease still holds the block.
      CtlRun revoked = asRoot("revoke-share", team.getShareId(), "--tenant", "token:team-a");
      assertOk(revoked);
      assertEquals("revoked share token " + team.getShareId() + " of tenant token:team-a; its block stays leased "
          + "until its other holders release it\n", revoked.out());
      CtlRun again = asRoot("revoke-share", team.getShareId(), "--tenant", "token:team-a");
      assertEquals(1, again.code());
      assertTrue(again.err().startsWith("gpumemctl: NOT_FOUND: "), again.err());
      GpuMemException gone = assertThrows(GpuMemException.class, () -> teamA.attach(teamShare.token()));
      assertEquals(Status.Code.NOT_FOUND, gone.code());

      // Its own token, with its lease released first: the token was the last hold.
      rootLease.close();
      CtlRun ownJson = asRoot("--json", "revoke-share", own.getShareId());
      assertOk(ownJson);
      RevokeShareResponse.Builder response = RevokeShareResponse.newBuilder();
      JsonFormat.parser().merge(ownJson.out(), response);
      assertTrue(response.getBlockReturned(), ownJson.out());
      assertEquals("no live share tokens\n", asRoot("shares").out());
    }
    assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES));
  }

  @Test
  void revokeShare_withoutAnId_isAUsageError() {
    CtlRun r = asRoot("revoke-share");
    assertEquals(2, r.code(), r.err());
    assertEquals("", r.out());
    assertTrue(r.err().contains("SHARE_ID"), r.err());
    assertTrue(r.err().contains("revoke-share --help"), r.err());
  }
}
