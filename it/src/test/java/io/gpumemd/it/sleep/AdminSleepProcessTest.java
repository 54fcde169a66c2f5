package io.gpumemd.it.sleep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.ctl.GpuMemCtl;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * An admin's sleep and wake of another process's session with gpumemctl (issue 35 item 5): a Java
 * client process ({@link AskedSleeperMain}) that registered a sleep handler is put to sleep by
 * {@code gpumemctl sleep SESSION}, another tenant's process leases the memory that freed, {@code
 * gpumemctl wake SESSION} brings it back, and the process finds every buffer at its address
 * with its bytes, its pause and resume having run once each. A process whose handler refuses
 * makes the admin's sleep fail with its reason, and nothing sleeps.
 *
 * <p>The daemon and the other tenant are {@link SleepProcessTest}'s: devices of 32 MiB, the sleeper
 * holds {@value #LEASES} x 4 MiB, so the other's 16 MiB fit only while it sleeps.
 */
class AdminSleepProcessTest {
  private static final int LEASES = 6;
  private static final long BIG = 4L << 20;

  @Test
  void anAdminSleepsAProcessWithAHandler_anotherTenantUsesTheMemory_andTheWakeKeepsAddressesAndBytes()
      throws Exception {
    try (TestDaemon daemon = SleepProcessTest.startDaemon()) {
      Asked sleeper = Asked.start(daemon.unixTarget(), "accept");
      try {
        String session = sleeper.await("LEASED")[1];
        assertEquals("RESOURCE_EXHAUSTED", SleepProcessTest.otherTenantLease(daemon), "before the sleep the other's lease does not fit");

        Ctl slept = ctl(daemon, "sleep", session, "--level", "1");
        assertEquals(0, slept.code(), slept.out());
        assertTrue(slept.out().startsWith("session " + session + " sleeps at level 1: " + LEASES + " leases in "),
            slept.out());
        assertEquals("PAUSED 1 []", String.join(" ", sleeper.await("PAUSED")), "the pause ran before the sleep");
        assertEquals(LEASES, session(daemon, session).getSleepingLeases());
        assertEquals(LEASES * BIG, session(daemon, session).getHostBytes());
        assertEquals("OK", SleepProcessTest.otherTenantLease(daemon), "the freed memory serves another tenant");

        Ctl woken = wake(daemon, session);
        assertEquals(0, woken.code(), woken.out());
        assertTrue(woken.out().startsWith("session " + session + " is awake: " + LEASES + " leases in "), woken.out());
        sleeper.await("RESUMED");
        Map<String, String> result = sleeper.result();
        assertEquals("1", result.get("pauses"), result.toString());
        assertEquals("1", result.get("resumes"), result.toString());
        assertEquals("true", result.get("sameAddresses"), result.toString());
        assertEquals("kept", result.get("contents"), result.toString());
        assertEquals("0", result.get("asleep"), result.toString());
        daemon.verifyInvariants();
      } finally {
        sleeper.process.destroyForcibly();
      }
    }
  }

  @Test
  void aHandlerThatRefuses_failsTheAdminsSleepWithItsReason_andNothingSleeps() throws Exception {
    try (TestDaemon daemon = SleepProcessTest.startDaemon()) {
      Asked sleeper = Asked.start(daemon.unixTarget(), "refuse");
      try {
        String session = sleeper.await("LEASED")[1];
        Ctl refused = ctl(daemon, "sleep", session);
        assertEquals(1, refused.code(), refused.out());
        assertTrue(refused.err().contains("FAILED_PRECONDITION") && refused.err().contains("session " + session
            + "'s client refused the admin's sleep: its sleep handler refused to pause"), refused.err());
        sleeper.await("REFUSING");
        assertEquals(0, session(daemon, session).getSleepingLeases());
        assertEquals("RESOURCE_EXHAUSTED", SleepProcessTest.otherTenantLease(daemon), "nothing was freed");
        daemon.verifyInvariants();
      } finally {
        sleeper.process.destroyForcibly();
      }
    }
  }

  @Test
  void anotherUidsGpumemctl_cannotSleepTheSession_itIsNotFoundThere_andNothingSleeps() throws Exception {
    assumeTrue(OtherUser.available(), "needs root to run gpumemctl under uid 65534 (setpriv)");
    try (TestDaemon daemon = SleepProcessTest.startDaemon()) {
      Asked sleeper = Asked.start(daemon.unixTarget(), "accept");
      try {
        String session = sleeper.await("LEASED")[1];
        // The real gpumemctl, as uid 65534 (another tenant, not an admin), on the same socket.
        List<String> command = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
            GpuMemCtl.class.getName());
        command.addAll(List.of("--target", daemon.unixTarget(), "sleep", session));
        Process intruder = new ProcessBuilder(command).redirectErrorStream(true).start();
        String said = new String(intruder.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(intruder.waitFor(60, TimeUnit.SECONDS));
        assertEquals(1, intruder.exitValue(), said);
        assertTrue(said.contains("NOT_FOUND") && said.contains("session " + session + " not found"), said);
        assertEquals(0, session(daemon, session).getSleepingLeases(), "nothing slept");
        assertEquals("RESOURCE_EXHAUSTED", SleepProcessTest.otherTenantLease(daemon), "nothing was freed");
        daemon.verifyInvariants();
      } finally {
        sleeper.process.destroyForcibly();
      }
    }
  }

  private record Ctl(int code, String out, String err) {}

  private static Ctl ctl(TestDaemon daemon, String... args) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    String[] all = new String[args.length + 2];
    all[0] = "--target";
    all[1] = daemon.unixTarget();
    System.arraycopy(args, 0, all, 2, args.length);
    int code = GpuMemCtl.run(all, new PrintStream(out, true, StandardCharsets.UTF_8),
        new PrintStream(err, true, StandardCharsets.UTF_8));
    return new Ctl(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
  }

  /**
   * gpumemctl wake, again for up to 5 s while the daemon answers RESOURCE_EXHAUSTED (the wake's
   * documented "try again": memory the other process gave back is free once the daemon has seen
   * its mappings go, which its exit does not wait for).
   */
  private static Ctl wake(TestDaemon daemon, String session) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (true) {
      Ctl woken = ctl(daemon, "wake", session);
      if (woken.code() == 0 || !woken.err().contains("RESOURCE_EXHAUSTED") || System.nanoTime() > deadline) {
        return woken;
      }
      Thread.sleep(20);
    }
  }

  private static SessionInfo session(TestDaemon daemon, String id) {
    try (GpuMemClient admin = GpuMemClient.builder(daemon.unixTarget()).clientName("admin").connect()) {
      return AdminGrpc.newBlockingStub(admin.connection().channel()).listSessions(ListSessionsRequest
          .getDefaultInstance()).getSessionsList().stream().filter(s -> s.getSessionId().equals(id)).findFirst()
          .orElseThrow();
    }
  }

  /** An {@link AskedSleeperMain} process. */
  private record Asked(Process process, BufferedReader out) {
    static Asked start(String target, String mode) throws Exception {
      List<String> command = DaemonProcess.javaCommand(AskedSleeperMain.class.getName());
      command.addAll(List.of(target, Integer.toString(LEASES), Long.toString(BIG), mode));
      Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
      return new Asked(p, new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8)));
    }

    /** The words of the next line that starts with {@code word}. */
    String[] await(String word) throws Exception {
      StringBuilder seen = new StringBuilder();
      String line;
      while ((line = out.readLine()) != null) {
        if (line.startsWith(word)) {
          return line.trim().split(" ");
        }
        seen.append(line).append('\n');
      }
      throw new AssertionError("the sleeper ended before " + word + ":\n" + seen);
    }

    /** Its RESULT line, once it has exited. */
    Map<String, String> result() throws Exception {
      String[] words = await("RESULT");
      Map<String, String> result = new HashMap<>();
      for (int i = 1; i < words.length; i++) {
        String[] kv = words[i].split("=", 2);
        result.put(kv[0], kv.length > 1 ? kv[1] : "");
      }
      assertTrue(process.waitFor(30, TimeUnit.SECONDS), "the sleeper exits after the wake");
      assertEquals(0, process.exitValue());
      return result;
    }
  }
}
