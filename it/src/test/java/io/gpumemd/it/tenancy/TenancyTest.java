package io.gpumemd.it.tenancy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.it.e2e.LeaseHolderMain;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.grpc.AdminService;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.ResultProcess;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Trust boundaries between tenants, with real processes under real, different uids (the test
 * runs as root, as CI does, and starts its second user with setpriv). Each case is one of the
 * reproductions of issue 13: before tenancy, every one of these calls succeeded for uid 65534.
 */
class TenancyTest {
  private static final byte[] SECRET = "TOP-SECRET payload of tenant uid:0".getBytes(StandardCharsets.US_ASCII);

  @BeforeAll
  static void needRoot() {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run clients as another uid");
  }

  private static TestDaemon startDaemon(String... extra) {
    List<String> flags = new ArrayList<>(List.of("--socket-mode", "0666"));
    flags.addAll(List.of(extra));
    TestDaemon daemon = TestDaemon.start(flags.toArray(String[]::new));
    OtherUser.openUp(daemon.server().socketPath().getParent());
    return daemon;
  }

  /** Runs the probe as {@code uid} (with {@code groups}) or, for uid 0, as this user in another process. */
  static Map<String, String> probe(int uid, List<Integer> groups, String target, String session, String lease,
      long bytes, String actions) throws Exception {
    return ResultProcess.parse(startProbe(uid, groups, target, session, lease, bytes, actions));
  }

  static Process startProbe(int uid, List<Integer> groups, String target, String session, String lease,
      long bytes, String actions) throws Exception {
    String main = TenantProbeMain.class.getName();
    List<String> command = uid == 0 ? DaemonProcess.javaCommand(main) : OtherUser.javaCommand(uid, uid, groups, main);
    command.addAll(List.of(target, session, lease, Long.toString(bytes), actions));
    return new ProcessBuilder(command).redirectErrorStream(true).start();
  }

  private static void write(Lease lease, byte[] bytes) {
    ByteBuffer buffer = lease.buffer();
    buffer.put(0, bytes);
  }

  private static byte[] read(Lease lease, int length) {
    byte[] out = new byte[length];
    lease.buffer().get(0, out);
    return out;
  }

  @Test
  void secondUser_overUnixSocketAndTcp_cannotSeeTouchOrTakeOverAnotherTenantsSession() throws Exception {
    try (TestDaemon daemon = startDaemon();
         GpuMemClient victim = GpuMemClient.builder(daemon.unixTarget()).clientName("victim").connect()) {
      Lease secret = victim.lease(0, 4096, false, "secret");
      write(secret, SECRET);
      // A freed neighbour in the victim's segment: the block a careless pool would hand out next.
      victim.lease(0, 4096, false, "freed").close();
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(victim.connection().channel());
      long capBefore = admin.getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).getRetentionCapBytes();

      String firstSegment = null;
      for (String target : List.of(daemon.unixTarget(), daemon.tcpTarget())) {
        Map<String, String> r = probe(OtherUser.NOBODY, List.of(), target, victim.sessionId(), secret.id(), 4096,
            "own,list,lease,release,attach,close,trim,cap");
        String where = target + "\n" + r.get("output");
        assertEquals("OK", r.get("ownLease"), "uid 65534 maps its own lease: " + where);
        if (firstSegment == null) {
          assertEquals("true", r.get("ownZero"), "nothing of the victim's in it: " + where);
          firstSegment = r.get("ownSegment");
        } else {
          // The second probe is the same tenant (uid 65534, now identified over TCP): it reuses
          // its tenant's own segment, bytes and all, exactly as sessions of one tenant always have.
          assertEquals(firstSegment, r.get("ownSegment"), "the tenant's own cached block: " + where);
        }
        assertNotEquals(Long.toString(secret.segmentId()), r.get("ownSegment"), "never the victim's segment: " + where);
        assertEquals("uid:65534", r.get("ownTenant"), where);
        assertEquals("false", r.get("victimSeen"), where);
        assertEquals("0", r.get("foreignLeasesSeen"), where);
        assertEquals("0", r.get("victimLeasesSeen"), where);
        for (String call : List.of("lease", "release", "attach", "close")) {
          assertEquals("NOT_FOUND", r.get(call), call + " on a foreign session must look like an unknown id: " + where);
        }
        assertEquals("PERMISSION_DENIED", r.get("trim"), where);
        assertEquals("PERMISSION_DENIED", r.get("cap"), where);
      }

      // The victim lost nothing: its bytes, its lease, its stream, the daemon's settings.
      assertEquals(new String(SECRET, StandardCharsets.US_ASCII), new String(read(secret, SECRET.length), StandardCharsets.US_ASCII));
      SessionInfo mine = admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
          .filter(s -> s.getSessionId().equals(victim.sessionId())).findFirst().orElseThrow();
      assertTrue(mine.getStreamAttached());
      assertEquals("uid:0", mine.getTenant());
      assertTrue(mine.getPeer().contains("pid " + ProcessHandle.current().pid()), mine.getPeer());
      assertEquals(1, admin.listLeases(ListLeasesRequest.newBuilder().setSessionId(victim.sessionId()).build())
          .getLeasesList().stream().filter(l -> l.getLeaseId().equals(secret.id())).count());
      assertEquals(capBefore, admin.getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).getRetentionCapBytes());
      secret.close();
      daemon.verifyInvariants();
    }
  }

  @Test
  void sharing_staysWithinTheTenant_anotherUidCannotAttachLookUpListOrRemove() throws Exception {
    try (TestDaemon daemon = startDaemon();
         GpuMemClient victim = GpuMemClient.builder(daemon.unixTarget()).clientName("victim").connect()) {
      Lease weights = victim.lease(0, 4096, false, "weights");
      write(weights, SECRET);
      String token = weights.share().token();
      victim.publish(weights, TenantProbeMain.OBJECT);
      String actions = "attachToken,lookup,objects,unpublish,removeObject";

      Map<String, String> intruder = probe(OtherUser.NOBODY, List.of(), daemon.unixTarget(), victim.sessionId(),
          token, 4096, actions);
      String where = intruder.get("output");
      assertEquals("NOT_FOUND", intruder.get("attachToken"), "another tenant's token looks unknown: " + where);
      assertEquals("NOT_FOUND", intruder.get("lookup"), where);
      assertEquals("0", intruder.get("objectsSeen"), where);
      assertEquals("NOT_FOUND", intruder.get("unpublish"), "its own tenant has no such name: " + where);
      assertEquals("PERMISSION_DENIED", intruder.get("removeObject"), where);

      // The control: a process of the victim's own uid attaches and looks up the same token and
      // name (its holds end with it), and sees the object.
      Map<String, String> sameTenant = probe(0, List.of(), daemon.unixTarget(), victim.sessionId(), token, 4096,
          "attachToken,lookup,objects");
      assertEquals("OK", sameTenant.get("attachToken"), sameTenant.get("output"));
      assertEquals("OK", sameTenant.get("lookup"), sameTenant.get("output"));
      assertEquals("1", sameTenant.get("objectsSeen"), sameTenant.get("output"));

      // Nothing of the victim's changed: its bytes, its name, its token.
      assertEquals(new String(SECRET, StandardCharsets.US_ASCII), new String(read(weights, SECRET.length), StandardCharsets.US_ASCII));
      try (Lease again = victim.lookup(TenantProbeMain.OBJECT); Lease byToken = victim.attach(token)) {
        assertEquals(weights.segmentId(), again.segmentId());
        assertEquals(weights.offset(), byToken.offset());
      }
      assertTrue(victim.unpublish(TenantProbeMain.OBJECT) == false, "the token and the lease still hold it");
      weights.close();
      daemon.verifyInvariants();
    }
  }

  @Test
  void sameUid_sharesItsTenantsSegments_unlessSessionsAreIsolated() throws Exception {
    for (boolean isolated : List.of(false, true)) {
      try (TestDaemon daemon = isolated ? startDaemon("--isolate", "session") : startDaemon();
           GpuMemClient victim = GpuMemClient.builder(daemon.unixTarget()).clientName("victim")
               .clientCacheBytes(0).connect()) {
        Lease secret = victim.lease(0, 4096, false, "secret");
        write(secret, SECRET);
        victim.lease(0, 4096, false, "freed").close();
        // Another process of the same uid: one tenant.
        Map<String, String> r = probe(0, List.of(), daemon.unixTarget(), victim.sessionId(), secret.id(), 4096, "own");
        assertEquals("OK", r.get("ownLease"), r.get("output"));
        if (isolated) {
          assertNotEquals(Long.toString(secret.segmentId()), r.get("ownSegment"),
              "--isolate session: a segment of its own: " + r.get("output"));
          assertEquals("true", r.get("ownZero"), r.get("output"));
        } else {
          // The documented default: sessions of one tenant share segments (and the TOP-SECRET
          // neighbour of issue 13 is readable to the same uid, as its memory is through /proc).
          assertEquals(Long.toString(secret.segmentId()), r.get("ownSegment"), r.get("output"));
        }
        secret.close();
        daemon.verifyInvariants();
      }
    }
  }

  @Test
  void socketModeAndGroup_decideWhoMayConnect() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--socket-mode", "0660", "--socket-group", "4242")) {
      OtherUser.openUp(daemon.server().socketPath().getParent());
      Path socket = daemon.server().socketPath();
      assertEquals("rw-rw----", java.nio.file.attribute.PosixFilePermissions.toString(
          java.nio.file.Files.getPosixFilePermissions(socket)));
      assertEquals(4242, java.nio.file.Files.getAttribute(socket, "unix:gid"));
      Map<String, String> member = probe(OtherUser.NOBODY, List.of(4242), daemon.unixTarget(), "0".repeat(32),
          "0".repeat(32), 4096, "list");
      assertEquals("OK", member.get("connect"), member.get("output"));
      assertEquals("uid:65534", member.get("ownTenant"), member.get("output"));
      Map<String, String> outsider = probe(OtherUser.NOBODY, List.of(), daemon.unixTarget(), "0".repeat(32),
          "0".repeat(32), 4096, "list");
      assertNotEquals("OK", outsider.get("connect"), outsider.get("output"));
    }
  }

  @Test
  void tenantQuota_holdsForAProcessThatOpensManySessions() throws Exception {
    try (TestDaemon daemon = startDaemon("--quota-max-leased-bytes", "16KiB", "--tenant-max-leased-bytes", "64KiB")) {
      Map<String, String> r = probe(OtherUser.NOBODY, List.of(), daemon.unixTarget(), "0".repeat(32),
          "0".repeat(32), 16 * 1024, "manySessions");
      assertEquals("4", r.get("leasesGranted"), "four 16 KiB sessions fill the tenant's 64 KiB: " + r.get("output"));
      assertEquals("RESOURCE_EXHAUSTED", r.get("refusal"), r.get("output"));
      // Another tenant (this process, uid 0) is not held back by uid 65534's use.
      try (GpuMemClient root = GpuMemClient.builder(daemon.unixTarget()).connect();
           Lease lease = root.lease(0, 16 * 1024)) {
        assertFalse(lease.isClosed());
      }
    }
  }

  @Test
  void sameTenantOtherProcess_cannotDisplaceTheLiveStream() throws Exception {
    try (TestDaemon daemon = startDaemon();
         GpuMemClient victim = GpuMemClient.builder(daemon.unixTarget()).clientName("victim").connect()) {
      Lease lease = victim.lease(0, 4096, false, "kept");
      Map<String, String> r = probe(0, List.of(), daemon.unixTarget(), victim.sessionId(), lease.id(), 4096, "attach");
      assertEquals("FAILED_PRECONDITION", r.get("attach"), r.get("output"));
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(victim.connection().channel());
      SessionInfo mine = admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
          .filter(s -> s.getSessionId().equals(victim.sessionId())).findFirst().orElseThrow();
      assertTrue(mine.getStreamAttached(), "the owner's stream is still the session's");
      // The owner's stream still works: a stream lease is served on it.
      try (Lease another = victim.lease(0, 4096, false, "after")) {
        assertFalse(another.isClosed());
      }
      lease.close();
    }
  }

  @Test
  void sigkilledOwner_leasesComeBackWithinGrace_whileAnIntruderKeepsTrying() throws Exception {
    try (TestDaemon daemon = startDaemon("--keepalive-grace-ms", "500");
         GpuMemClient observer = GpuMemClient.builder(daemon.unixTarget()).clientName("observer").connect()) {
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(observer.connection().channel());
      List<String> command = DaemonProcess.javaCommand(LeaseHolderMain.class.getName());
      command.addAll(List.of(daemon.unixTarget(), "owner", "3", "100000"));
      Process owner = new ProcessBuilder(command).redirectErrorStream(true).start();
      BufferedReader out = new BufferedReader(new InputStreamReader(owner.getInputStream(), StandardCharsets.UTF_8));
      String line;
      while ((line = out.readLine()) != null && !line.startsWith("READY")) {
        // wait for its leases
      }
      assertTrue(line != null, "the owner exited before READY");
      String ownerSession = admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
          .filter(s -> s.getClientName().equals("owner")).findFirst().orElseThrow().getSessionId();

      Process intruder = startProbe(OtherUser.NOBODY, List.of(), daemon.unixTarget(), ownerSession,
          line.substring(6).trim().split(" ")[0], 4096, "attachLoop");
      BufferedReader intruderOut = new BufferedReader(new InputStreamReader(intruder.getInputStream(), StandardCharsets.UTF_8));
      StringBuilder intruderLog = new StringBuilder();
      while ((line = intruderOut.readLine()) != null && !line.startsWith("TRYING")) {
        intruderLog.append(line).append('\n');
      }
      assertTrue(line != null, "the intruder exited early:\n" + intruderLog);
      owner.destroyForcibly();
      assertTrue(owner.waitFor(10, TimeUnit.SECONDS));
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(500 + 1500);
      while (countLeases(admin, ownerSession) > 0 && System.nanoTime() < deadline) {
        Thread.sleep(20);
      }
      assertEquals(0, countLeases(admin, ownerSession), "the killed owner's leases came back within grace");
      StringBuilder rest = new StringBuilder();
      while ((line = intruderOut.readLine()) != null) {
        rest.append(line).append('\n');
      }
      assertTrue(intruder.waitFor(30, TimeUnit.SECONDS));
      assertTrue(rest.toString().contains(" attachLoop=NOT_FOUND\n"), "every attach was refused as unknown:\n" + rest);
      daemon.verifyInvariants();
    }
  }

  private static long countLeases(AdminGrpc.AdminBlockingStub admin, String session) {
    return admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesList().stream()
        .filter(l -> l.getSessionId().equals(session)).count();
  }

  @Test
  void adminGroupMember_mayTrimAndCap_andTheAuditLineNamesIt() throws Exception {
    try (LogCapture audit = new LogCapture(AdminService.class);
         TestDaemon daemon = startDaemon("--admin-group", "4242")) {
      Map<String, String> outsider = probe(OtherUser.NOBODY, List.of(), daemon.unixTarget(),
          "0".repeat(32), "0".repeat(32), 4096, "trim,cap");
      assertEquals("PERMISSION_DENIED", outsider.get("trim"), outsider.get("output"));
      assertEquals("PERMISSION_DENIED", outsider.get("cap"), outsider.get("output"));
      Map<String, String> member = probe(OtherUser.NOBODY, List.of(4242), daemon.unixTarget(),
          "0".repeat(32), "0".repeat(32), 4096, "trim,cap");
      assertEquals("OK", member.get("trim"), member.get("output"));
      assertEquals("OK", member.get("cap"), member.get("output"));
      List<String> lines = audit.messages("INFO");
      assertTrue(lines.stream().anyMatch(l -> l.startsWith("Trim ") && l.contains("by uid 65534")), lines.toString());
      assertTrue(lines.stream().anyMatch(l -> l.startsWith("Retention cap set") && l.contains("by uid 65534")),
          lines.toString());
    }
  }

  @Test
  void memoryAnotherTenantReleased_reachesTheNextTenantOnlyAsZeros() throws Exception {
    // 8 MiB per device: four 2 MiB segments. The victim fills them, writes, and releases them
    // all; the second user's lease must evict one (the victim unmaps it on request) and see zeros.
    try (TestDaemon daemon = startDaemon("--host-device-bytes", "8MiB");
         GpuMemClient victim = GpuMemClient.builder(daemon.unixTarget()).clientName("victim")
             .clientCacheBytes(0).connect()) {
      List<Lease> leases = new ArrayList<>();
      List<String> segments = new ArrayList<>();
      for (int i = 0; i < 8; i++) {
        Lease lease = victim.lease(0, 1 << 20, false, "fill");
        byte[] junk = new byte[1 << 20];
        java.util.Arrays.fill(junk, (byte) 0xAB);
        write(lease, junk);
        segments.add(Long.toString(lease.segmentId()));
        leases.add(lease);
      }
      leases.forEach(Lease::close);
      Map<String, String> r = probe(OtherUser.NOBODY, List.of(), daemon.unixTarget(), victim.sessionId(),
          "0".repeat(32), 1 << 20, "own");
      assertEquals("OK", r.get("ownLease"), r.get("output"));
      assertEquals("true", r.get("ownZero"), r.get("output"));
      assertFalse(segments.contains(r.get("ownSegment")), "a fresh segment, never one of the victim's: " + r.get("output"));
      daemon.verifyInvariants();
    }
  }

}
