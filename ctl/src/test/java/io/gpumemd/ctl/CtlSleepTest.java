package io.gpumemd.ctl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.SleepHandler;
import io.gpumemd.proto.v1.WakeResponse;
import io.gpumemd.server.testing.Await;
import io.gpumemd.server.testing.TestDaemon;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * {@code gpumemctl sleep} and {@code wake} against a live daemon on the host backend, with the
 * session's client in this JVM: what each prints (text and JSON), that the client's handler ran,
 * and the refusals as exit codes and messages.
 */
class CtlSleepTest {
  private TestDaemon daemon;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  private CtlRun ctl(String... args) {
    String[] full = new String[args.length + 2];
    full[0] = "--target";
    full[1] = daemon.unixTarget();
    System.arraycopy(args, 0, full, 2, args.length);
    return CtlRun.of(full);
  }

  @Test
  void sleepAndWake_goThroughTheClientsHandler_andSayWhatSleptAndWoke() throws Exception {
    List<String> calls = new CopyOnWriteArrayList<>();
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName("engine").connect();
         Lease lease = client.lease(0, 4 << 20, false, "kv")) {
      client.onSleepAsked(new SleepHandler() {
        @Override
        public void pause(int level, List<String> tags) {
          calls.add("pause " + level + " " + tags);
        }

        @Override
        public void resume() {
          calls.add("resume");
        }
      });
      String session = client.sessionId();
      lease.buffer().put(0, (byte) 7);

      CtlRun slept = ctl("sleep", session, "--level", "2", "--tags", "kv,other");
      assertEquals(0, slept.code(), slept.err());
      assertTrue(slept.out().startsWith("session " + session + " sleeps at level 2: 1 leases in 1 segments, "),
          slept.out());
      assertTrue(slept.out().endsWith(" of device memory freed, 0 B in host memory\n"), slept.out());
      assertEquals(List.of("pause 2 [kv, other]"), calls);
      // The client marks the lease asleep when the daemon's event says so, which may come just after the call's answer.
      Await.until(lease::isAsleep, "the lease is marked asleep");
      CtlRun again = ctl("sleep", session);
      assertEquals(1, again.code());
      assertTrue(again.err().startsWith("gpumemctl: FAILED_PRECONDITION: session " + session + " sleeps already"),
          again.err());

      CtlRun woken = ctl("--json", "wake", session);
      assertEquals(0, woken.code(), woken.err());
      WakeResponse.Builder json = WakeResponse.newBuilder();
      JsonFormat.parser().merge(woken.out(), json);
      assertEquals(List.of(lease.id()), json.getSegments(0).getLeaseIdsList());
      waitFor(() -> calls.size() == 2); // resume runs once the client has mapped everything again
      assertEquals(List.of("pause 2 [kv, other]", "resume"), calls);
      assertEquals(0, lease.buffer().get(0), "level 2 wakes zeroed");
      CtlRun awake = ctl("wake", session);
      assertEquals(1, awake.code());
      assertTrue(awake.err().startsWith("gpumemctl: FAILED_PRECONDITION: session " + session + " is awake"),
          awake.err());
    }
  }

  @Test
  void aClientWithoutHandler_anUnknownSession_andABadLevel_exitOne_namingWhy() throws Exception {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName("plain").connect()) {
      CtlRun refused = ctl("sleep", client.sessionId());
      assertEquals(1, refused.code());
      assertTrue(refused.err().startsWith("gpumemctl: FAILED_PRECONDITION: session " + client.sessionId()
          + "'s client registered no sleep handler"), refused.err());
      CtlRun level = ctl("sleep", client.sessionId(), "--level", "3");
      assertEquals(1, level.code());
      assertTrue(level.err().startsWith("gpumemctl: INVALID_ARGUMENT: level: 3"), level.err());
    }
    CtlRun unknown = ctl("wake", "0123456789abcdef0123456789abcdef");
    assertEquals(1, unknown.code());
    assertTrue(unknown.err().startsWith("gpumemctl: NOT_FOUND: session 0123456789abcdef0123456789abcdef not found"),
        unknown.err());
    CtlRun usage = ctl("sleep");
    assertEquals(2, usage.code(), usage.err());
    assertTrue(usage.err().contains("SESSION"), usage.err());
  }

  @Test
  void help_describesSleepAndWake() {
    CtlRun top = CtlRun.of("--help");
    assertTrue(top.out().contains("\n  sleep ") && top.out().contains("\n  wake "), top.out());
    CtlRun sleep = CtlRun.of("sleep", "--help");
    assertEquals(0, sleep.code());
    for (String flag : List.of("SESSION", "--level=1|2", "--tags=TAG[,TAG...]", "--json")) {
      assertTrue(sleep.out().contains(flag), flag + " in\n" + sleep.out());
    }
  }

  /** Waits up to 5 s for {@code done}: the handler's resume runs on the client's own thread. */
  private static void waitFor(java.util.function.BooleanSupplier done) throws InterruptedException {
    long deadline = System.nanoTime() + 5_000_000_000L;
    while (!done.getAsBoolean() && System.nanoTime() < deadline) {
      Thread.sleep(10);
    }
  }
}
