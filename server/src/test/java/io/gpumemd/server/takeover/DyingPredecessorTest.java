package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.unix.ProcessStat;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * A successor whose predecessor went away mid-hand-over waits for that process to be gone
 * before it probes the sockets (a dying process's listening sockets may still accept), and waits
 * no longer than its bound for one that lives on. Real child processes.
 */
class DyingPredecessorTest {

  @Test
  void waitsUntilTheProcessHasExited() throws Exception {
    Process sleeper = new ProcessBuilder("sleep", "60").start();
    int pid = (int) sleeper.pid();
    Thread waiter = new Thread(() -> {
      try {
        TakeOver.awaitExit(pid, 30_000);
      } catch (java.io.IOException e) {
        throw new AssertionError(e);
      }
    });
    try {
      waiter.start();
      waiter.join(300);
      assertTrue(waiter.isAlive(), "returned while the process still ran");
      sleeper.destroyForcibly();
      waiter.join(TimeUnit.SECONDS.toMillis(10));
      assertFalse(waiter.isAlive(), "still waiting after the process exited");
      assertFalse(ProcessStat.anyThreadRuns(pid));
    } finally {
      sleeper.destroyForcibly();
      waiter.interrupt();
    }
  }

  @Test
  void neverWaitsForItself_norForAPidItCannotSee() {
    // Waiting out the bound (60 s) here would fail the test after 10.
    assertTimeoutPreemptively(Duration.ofSeconds(10), () -> {
      TakeOver.awaitExit((int) ProcessHandle.current().pid(), 60_000);
      TakeOver.awaitExit(0, 60_000);
    });
  }

  @Test
  void givesUpAfterItsBound_onAProcessThatLivesOn() throws Exception {
    Process sleeper = new ProcessBuilder("sleep", "60").start();
    try {
      long started = System.nanoTime();
      TakeOver.awaitExit((int) sleeper.pid(), 200);
      assertTrue(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started) >= 200);
      assertTrue(ProcessStat.anyThreadRuns((int) sleeper.pid()));
    } finally {
      sleeper.destroyForcibly();
      sleeper.waitFor(10, TimeUnit.SECONDS);
    }
  }
}
