package io.gpumemd.it.sleep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.it.tenancy.TenantProbeMain;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.ResultProcess;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Sleep and wake with real processes on the host backend (issue 35 item 6): a Java client
 * process ({@link SleeperMain}) sleeps and wakes with every buffer at its old address and with
 * its bytes (level 1) or zeros (level 2), while another tenant's process leases the memory the
 * sleep freed (as uid 65534 when the test runs as root, as CI does; else another process of
 * the same user); a sleeping client SIGKILLed loses its leases and its parked contents after
 * the grace period, and the memory serves others.
 *
 * <p>Devices of {@value #DEVICE_MIB} MiB: the sleeper holds {@value #LEASES} x 4 MiB, so the
 * other's {@value #OTHER_MIB} MiB fit only while it sleeps.
 */
class SleepProcessTest {
  private static final int DEVICE_MIB = 32;
  private static final int LEASES = 6;
  private static final long BIG = 4L << 20;
  private static final int OTHER_MIB = 16;

  static TestDaemon startDaemon() {
    TestDaemon daemon = TestDaemon.start("--host-device-bytes", DEVICE_MIB + "MiB", "--socket-mode", "0666");
    OtherUser.openUp(daemon.server().socketPath().getParent());
    return daemon;
  }

  @ParameterizedTest(name = "level {0}")
  @ValueSource(ints = {1, 2})
  void sleepingProcess_wakesWithItsAddressesAndContents_afterAnotherTenantUsedTheMemory(int level) throws Exception {
    try (TestDaemon daemon = startDaemon()) {
      Sleeper sleeper = Sleeper.start(daemon.unixTarget(), level);
      try {
        sleeper.await("LEASED");
        assertEquals("RESOURCE_EXHAUSTED", otherTenantLease(daemon), "before the sleep the other's lease does not fit");

        String[] slept = sleeper.tell("sleep", "SLEPT");
        assertEquals(Integer.toString(LEASES), slept[1], "every lease sleeps");
        assertTrue(Long.parseLong(slept[2]) >= LEASES * BIG, "device bytes freed: " + slept[2]);
        assertEquals(level == 1 ? Long.toString(LEASES * BIG) : "0", slept[3], "host bytes kept");
        assertEquals("OK", otherTenantLease(daemon), "the freed memory serves another tenant");

        Map<String, String> result = sleeper.finish("wake");
        assertEquals(Integer.toString(LEASES), result.get("woken"), result.get("output"));
        assertEquals("true", result.get("sameAddresses"), result.get("output"));
        assertEquals(level == 1 ? "kept" : "zero", result.get("contents"), result.get("output"));
        daemon.verifyInvariants();
      } finally {
        sleeper.process.destroyForcibly();
      }
    }
  }

  @Test
  void sigkilledSleepingClient_leasesAndParkedContentsGo_afterTheGracePeriod() throws Exception {
    try (TestDaemon daemon = startDaemon();
         GpuMemClient survivor = GpuMemClient.builder(daemon.unixTarget()).clientName("survivor").connect()) {
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(survivor.connection().channel());
      Sleeper sleeper = Sleeper.start(daemon.unixTarget(), 1);
      try {
        String session = sleeper.await("LEASED")[1];
        sleeper.tell("sleep", "SLEPT");
        SessionInfo asleep = session(admin, session);
        assertEquals(LEASES, asleep.getSleepingLeases());
        assertEquals(LEASES * BIG, asleep.getHostBytes(), "the contents parked in the daemon's host memory");
        assertTrue(admin.listLeases(ListLeasesRequest.newBuilder().setSessionId(session).build()).getLeasesList()
            .stream().allMatch(l -> l.getSleepLevel() == 1));

        sleeper.process.destroyForcibly(); // SIGKILL, asleep
        assertTrue(sleeper.process.waitFor(10, TimeUnit.SECONDS));
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(500 + 1000); // the grace period + 1 s
        List<LeaseInfo> left;
        while (!(left = admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesList()).isEmpty()
            && System.nanoTime() < deadline) {
          Thread.sleep(20);
        }
        assertEquals(List.of(), left, "the sleeping leases are released with the session");
        assertTrue(admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
            .noneMatch(s -> s.getSessionId().equals(session)), "the session is gone");
        List<Lease> all = new ArrayList<>(); // the whole device serves another session again
        for (int i = 0; i < DEVICE_MIB / 4; i++) {
          all.add(survivor.lease(0, BIG));
        }
        all.forEach(Lease::close);
        daemon.verifyInvariants();
      } finally {
        sleeper.process.destroyForcibly();
      }
    }
  }

  private static SessionInfo session(AdminGrpc.AdminBlockingStub admin, String id) {
    return admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
        .filter(s -> s.getSessionId().equals(id)).findFirst().orElseThrow();
  }

  /** Another tenant's process leases {@value #OTHER_MIB} MiB, writes it and gives it back: OK, or its status. */
  static String otherTenantLease(TestDaemon daemon) throws Exception {
    String main = TenantProbeMain.class.getName();
    List<String> command = OtherUser.available()
        ? OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(), main)
        : DaemonProcess.javaCommand(main);
    command.addAll(List.of(daemon.unixTarget(), "-", "-", Long.toString((long) OTHER_MIB << 20), "own"));
    String outcome = ResultProcess.parse(new ProcessBuilder(command).redirectErrorStream(true).start()).get("ownLease");
    return outcome.contains("RESOURCE_EXHAUSTED") ? "RESOURCE_EXHAUSTED" : outcome;
  }

  /** A {@link SleeperMain} process, told what to do on its stdin. */
  private record Sleeper(Process process, BufferedReader out, Writer in) {
    static Sleeper start(String target, int level) throws Exception {
      List<String> command = DaemonProcess.javaCommand(SleeperMain.class.getName());
      command.addAll(List.of(target, Integer.toString(LEASES), Long.toString(BIG), Integer.toString(level)));
      Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
      return new Sleeper(p, new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8)),
          new OutputStreamWriter(p.getOutputStream(), StandardCharsets.UTF_8));
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

    String[] tell(String command, String answer) throws Exception {
      in.write(command + "\n");
      in.flush();
      return await(answer);
    }

    /** Tells it {@code command}, and parses its RESULT line once it has exited. */
    Map<String, String> finish(String command) throws Exception {
      String[] words = tell(command, "RESULT");
      Map<String, String> result = new HashMap<>();
      for (int i = 1; i < words.length; i++) {
        String[] kv = words[i].split("=", 2);
        result.put(kv[0], kv[1]);
      }
      result.put("output", String.join(" ", words));
      assertTrue(process.waitFor(30, TimeUnit.SECONDS), "the sleeper exits after the wake");
      assertEquals(0, process.exitValue());
      return result;
    }
  }
}
