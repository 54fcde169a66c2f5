package io.gpumemd.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.LogCapture;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The daemon's periodic tasks survive their own failures, and an OutOfMemoryError ends the process. */
class HousekeepingTest {

  @Test
  void aTaskThatThrows_anErrorOrAnException_runsAgainAtItsNextTick() throws Exception {
    AtomicInteger runs = new AtomicInteger();
    Housekeeping.Task task = new Housekeeping.Task("Test task", () -> {
      int n = runs.incrementAndGet();
      if (n == 1) {
        throw new IllegalStateException("first run fails");
      }
      if (n == 2) {
        // Not a RuntimeException: what used to cancel the reaper for good.
        throw new AssertionError("second run fails too");
      }
    });
    ScheduledThreadPoolExecutor scheduler = new ScheduledThreadPoolExecutor(1);
    try (LogCapture log = new LogCapture(Housekeeping.class)) {
      scheduler.scheduleWithFixedDelay(task, 1, 1, TimeUnit.MILLISECONDS);
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (runs.get() < 5 && System.nanoTime() < deadline) {
        Thread.sleep(5);
      }
      assertTrue(runs.get() >= 5, "the task kept running after it threw: " + runs.get() + " runs");
      assertEquals(2, task.failures());
      assertEquals(1, log.messages("ERROR").size(), "the first failure is logged with its cause, the next "
          + "within a minute is counted: " + log.messages("ERROR"));
      assertTrue(log.anyStackTrace());
    } finally {
      scheduler.shutdownNow();
    }
  }

  @Test
  void anOutOfMemoryErrorInATask_endsTheProcess_withStatus3_andOneLine() throws Exception {
    Process p = new ProcessBuilder(DaemonProcess.javaCommand(OutOfMemoryMain.class.getName()))
        .redirectErrorStream(true).start();
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), "the process exits");
    String output = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals(Housekeeping.OUT_OF_MEMORY_EXIT, p.exitValue(), output);
    assertTrue(output.contains("Test task: java.lang.OutOfMemoryError: Java heap space (simulated): gpumemd exits "
        + "(status 3) so that its supervisor restarts it"), output);
    assertTrue(!output.contains("still running"), output);
  }

  /** A process whose housekeeping task runs out of memory. */
  public static final class OutOfMemoryMain {
    public static void main(String[] args) throws IOException, InterruptedException {
      new Housekeeping.Task("Test task", () -> {
        throw new OutOfMemoryError("Java heap space (simulated)");
      }).run();
      System.out.println("still running");
    }
  }
}
