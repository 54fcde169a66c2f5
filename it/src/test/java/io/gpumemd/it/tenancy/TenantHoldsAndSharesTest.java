package io.gpumemd.it.tenancy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.ctl.GpuMemCtl;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.ResultProcess;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Issue 22's per-tenant bound on holds and the admin verbs on share tokens, with real processes
 * under a real, different uid (65534, started with setpriv; the test runs as root, an admin).
 * uid 65534's holds stop at its tenant's bound while uid 0's go on; uid 65534 can neither list
 * nor revoke uid 0's tokens; root lists uid 65534's token and revokes it, after which attaching
 * with it answers NOT_FOUND and its block goes back once its holders are gone.
 */
class TenantHoldsAndSharesTest {
  private static final int HOLDS_PER_TENANT = 6;

  @BeforeAll
  static void needRoot() {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run clients as another uid");
  }

  private static TestDaemon startDaemon() {
    TestDaemon daemon = TestDaemon.start("--socket-mode", "0666", "--max-holds-per-tenant",
        Integer.toString(HOLDS_PER_TENANT));
    OtherUser.openUp(daemon.server().socketPath().getParent());
    return daemon;
  }

  private static Process probe(String... args) throws Exception {
    List<String> command = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
        HoldsAndSharesProbeMain.class.getName());
    command.addAll(List.of(args));
    return new ProcessBuilder(command).redirectErrorStream(true).start();
  }

  /** Reads the process's output up to a line starting with {@code prefix}; returns that line. */
  private static String awaitLine(Process p, BufferedReader out, String prefix) throws Exception {
    StringBuilder seen = new StringBuilder();
    String line;
    while ((line = out.readLine()) != null && !line.startsWith(prefix)) {
      seen.append(line).append('\n');
    }
    if (line == null) {
      p.waitFor(10, TimeUnit.SECONDS);
      throw new AssertionError("the probe ended before " + prefix + ":\n" + seen);
    }
    return line;
  }

  /** Tells a waiting probe to go on, then parses its RESULT line. */
  private static Map<String, String> finish(Process p) throws Exception {
    p.getOutputStream().write("go\n".getBytes(StandardCharsets.US_ASCII));
    p.getOutputStream().flush();
    return ResultProcess.parse(p);
  }

  @Test
  void holds_areRefusedAtTheTenantsBound_whileAnotherTenantsGoOn_andComeBackWhenTheyEnd() throws Exception {
    try (TestDaemon daemon = startDaemon()) {
      Process intruder = probe(daemon.unixTarget(), "holds");
      BufferedReader out = new BufferedReader(new InputStreamReader(intruder.getInputStream(), StandardCharsets.UTF_8));
      awaitLine(intruder, out, "HOLDING");

      // uid 65534 sits at its bound: this process (uid 0) takes as many holds of its own.
      try (GpuMemClient root = GpuMemClient.builder(daemon.unixTarget()).clientName("root").connect();
           GpuMemClient reader = GpuMemClient.builder(daemon.unixTarget()).clientName("root-reader").connect();
           Lease lease = root.lease(0, 4096)) {
        String token = lease.share().token();
        List<Lease> holds = new ArrayList<>();
        for (int i = 0; i < HOLDS_PER_TENANT; i++) {
          holds.add(reader.attach(token));
        }
        GpuMemException beyond = assertThrows(GpuMemException.class, () -> reader.attach(token));
        assertEquals(Status.Code.RESOURCE_EXHAUSTED, beyond.code(), "admins are held to it too");
        assertTrue(beyond.serverMessage().contains("tenant uid:0 has " + HOLDS_PER_TENANT + " holds"),
            beyond.serverMessage());
        holds.forEach(Lease::close);
      }

      Map<String, String> r = finishReading(intruder, out);
      String where = r.get("output");
      assertEquals(Integer.toString(HOLDS_PER_TENANT), r.get("holdsGranted"), where);
      assertEquals("RESOURCE_EXHAUSTED", r.get("refusal"), where);
      assertEquals("true", r.get("refusalNamesTenantAndFlag"), where);
      assertEquals("OK", r.get("afterRelease"), "a released hold gave its place back: " + where);
      assertEquals("RESOURCE_EXHAUSTED", r.get("beyondAgain"), where);
      assertEquals("3/3", r.get("afterSessionEnd"), "an ended session gave its holds' places back: " + where);
      assertEquals("RESOURCE_EXHAUSTED", r.get("beyondThird"), where);

      // The first process exited: its sessions ended, and a second process has the whole bound.
      Map<String, String> again = finish(probe(daemon.unixTarget(), "holds"));
      assertEquals(Integer.toString(HOLDS_PER_TENANT), again.get("holdsGranted"), again.get("output"));
      daemon.verifyInvariants();
    }
  }

  /** Sends the go-ahead to a probe whose output is already being read, and parses what follows. */
  private static Map<String, String> finishReading(Process p, BufferedReader out) throws Exception {
    p.getOutputStream().write("go\n".getBytes(StandardCharsets.US_ASCII));
    p.getOutputStream().flush();
    StringBuilder rest = new StringBuilder();
    String line;
    String result = null;
    while ((line = out.readLine()) != null) {
      rest.append(line).append('\n');
      if (line.startsWith("RESULT")) {
        result = line;
      }
    }
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), "the probe did not end:\n" + rest);
    assertEquals(0, p.exitValue(), rest.toString());
    assertTrue(result != null, "no RESULT line:\n" + rest);
    Map<String, String> parsed = new java.util.HashMap<>();
    for (String kv : result.substring("RESULT".length()).trim().split(" ")) {
      String[] pair = kv.split("=", 2);
      parsed.put(pair[0], pair[1]);
    }
    parsed.put("output", rest.toString());
    return parsed;
  }

  @Test
  void anotherUid_cannotListOrRevokeRootsTokens_rootRevokesItsToken_andTheBlockGoesBackWithItsHolders()
      throws Exception {
    try (LogCapture audit = new LogCapture(SharedObjects.class);
         TestDaemon daemon = startDaemon();
         GpuMemClient root = GpuMemClient.builder(daemon.unixTarget()).clientName("victim").connect();
         Lease weights = root.lease(0, 4096)) {
      String rootToken = weights.share().token();
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(root.connection().channel());
      String rootShareId = admin.listShares(ListSharesRequest.newBuilder().setTenant("uid:0").build())
          .getShares(0).getShareId();

      Process intruder = probe(daemon.unixTarget(), "shares", rootShareId);
      BufferedReader out = new BufferedReader(new InputStreamReader(intruder.getInputStream(), StandardCharsets.UTF_8));
      String shared = awaitLine(intruder, out, "SHARED ");
      String session = shared.split(" ")[1].substring("session=".length());
      String lease = shared.split(" ")[2].substring("lease=".length());

      // The real gpumemctl, as uid 65534: refused, whether listing or revoking.
      List<String> ctl = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(), GpuMemCtl.class.getName());
      ctl.addAll(List.of("--target", daemon.unixTarget(), "revoke-share", rootShareId, "--tenant", "uid:0"));
      Process denied = new ProcessBuilder(ctl).redirectErrorStream(true).start();
      String deniedOut = new String(denied.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(denied.waitFor(60, TimeUnit.SECONDS));
      assertEquals(1, denied.exitValue(), deniedOut);
      assertTrue(deniedOut.contains("gpumemctl: PERMISSION_DENIED: revoking another tenant's share token needs an "
          + "admin identity"), deniedOut);

      // Root, an admin, lists uid 65534's token (by its id; the producer released its lease) ...
      List<ShareInfo> theirs = admin.listShares(ListSharesRequest.newBuilder().setTenant("uid:65534").build())
          .getSharesList();
      assertEquals(1, theirs.size(), theirs.toString());
      ShareInfo token = theirs.get(0);
      assertEquals(session, token.getSessionId());
      assertEquals(lease, token.getLeaseId());
      assertEquals(2, token.getHolds(), "the token and the holder's attach");
      long rootBlock = weights.blockBytes();
      assertEquals(rootBlock + token.getBlockBytes(), leasedBytes(admin));

      // ... and revokes it with gpumemctl: the holder still holds the block.
      ByteArrayOutputStream ctlOut = new ByteArrayOutputStream();
      int code = GpuMemCtl.run(new String[] {"--target", daemon.unixTarget(), "revoke-share", token.getShareId(),
          "--tenant", "uid:65534"}, new PrintStream(ctlOut, true, StandardCharsets.UTF_8), System.err);
      assertEquals(0, code, ctlOut.toString(StandardCharsets.UTF_8));
      assertEquals("revoked share token " + token.getShareId() + " of tenant uid:65534; its block stays leased until "
          + "its other holders release it\n", ctlOut.toString(StandardCharsets.UTF_8));
      assertTrue(audit.messages("INFO").stream().anyMatch(l -> l.startsWith("Share token " + token.getShareId()
          + " of tenant uid:65534") && l.contains("revoked by uid 0")), audit.messages("INFO").toString());
      assertEquals(rootBlock + token.getBlockBytes(), leasedBytes(admin), "the holder keeps it");

      Map<String, String> r = finishReading(intruder, out);
      String where = r.get("output");
      assertEquals("PERMISSION_DENIED", r.get("listVictims"), where);
      assertEquals("1", r.get("sharesSeen"), "its own token only: " + where);
      assertEquals("true", r.get("ownTenantOnly"), where);
      assertEquals("PERMISSION_DENIED", r.get("revokeVictims"), where);
      assertEquals("NOT_FOUND", r.get("revokeVictimsAsOwn"), "its own tenant has no such id: " + where);
      assertEquals("NOT_FOUND", r.get("attachAfterRevoke"), "the revoked token attaches nobody: " + where);
      assertEquals("OK", r.get("released"), where);

      // Its holders gone, the block went back. Root's own token lived through all of it.
      assertEquals(rootBlock, leasedBytes(admin));
      assertEquals(List.of(rootShareId), admin.listShares(ListSharesRequest.getDefaultInstance()).getSharesList()
          .stream().map(ShareInfo::getShareId).toList());
      try (Lease mine = root.attach(rootToken)) {
        assertEquals(weights.offset(), mine.offset());
      }
      assertFalse(weights.isClosed());
      daemon.verifyInvariants();
    }
  }

  private static long leasedBytes(AdminGrpc.AdminBlockingStub admin) {
    return admin.getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).getLeasedBytes();
  }
}
