package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.ProcessStat;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Waits, within a bound, until this JVM's JIT compiler threads are idle, so that a take-over's
 * pause does not share the machine's cores with compilations queued just before it (by the
 * rehearsal, or by adopting the segments sent ahead). Measured with {@code TakeOverPauseMain}
 * (10,000 live leases, two cores, the JIT's log beside): a successor that asked at once had
 * 200–350 ms of compiler time queued between its ask and the state's arrival, and spent 50–85 ms
 * more of it during its restore, inside the pause.
 *
 * <p>Reads the CPU time, in clock ticks, of the threads named {@code C1 CompilerThre…} and {@code
 * C2 CompilerThre…} in {@code /proc/self/task} (HotSpot's names; the JVM starts and stops them as
 * its queue asks): idle means none of it grew for {@link #QUIET_MILLIS}. Where {@code /proc}
 * names none (another OS or JVM), it does not wait. Stateless; thread-safe.
 */
final class CompilerQuiet {
  private static final Logger log = LoggerFactory.getLogger(CompilerQuiet.class);
  /** How long the compiler threads must have run nothing to count as idle (a few clock ticks). */
  static final long QUIET_MILLIS = 40;
  /** The most a take-over step waits before its pause begins ({@link #beforePause}). */
  static final long BEFORE_PAUSE_MILLIS = 500;
  private static final long POLL_MILLIS = 10;

  private CompilerQuiet() {}

  /**
   * Waits at most {@link #BEFORE_PAUSE_MILLIS} for the compiler threads to go idle, the daemon
   * serving on meanwhile: run just before a step that starts the pause. An interrupt ends the
   * wait (and stays set).
   */
  static void beforePause() {
    long started = System.nanoTime();
    boolean idle;
    try {
      idle = await(BEFORE_PAUSE_MILLIS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return;
    }
    log.debug("Take-over: the JIT's compiler threads {} after {} ms", idle ? "went idle" : "still ran",
        (System.nanoTime() - started) / 1_000_000);
  }

  /**
   * Returns once the compiler threads have been idle for {@link #QUIET_MILLIS}, or after {@code
   * maxMillis} whatever they do.
   *
   * @return whether they went idle (true at once where none is found)
   */
  static boolean await(long maxMillis) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(maxMillis);
    long quiet = TimeUnit.MILLISECONDS.toNanos(QUIET_MILLIS);
    long ticks = compilerTicks();
    if (ticks < 0) {
      return true;
    }
    long idleSince = System.nanoTime();
    while (System.nanoTime() - idleSince < quiet) {
      if (System.nanoTime() >= deadline) {
        return false;
      }
      Thread.sleep(POLL_MILLIS);
      long now = compilerTicks();
      if (now != ticks) {
        ticks = now;
        idleSince = System.nanoTime();
      }
    }
    return true;
  }

  /**
   * The user and system clock ticks of this JVM's compiler threads, in all; -1 where none is
   * found. A compiler thread that exits takes its ticks along: the sum falls, which counts as a
   * change.
   */
  static long compilerTicks() {
    long sum = 0;
    boolean found = false;
    for (ProcessStat thread : ProcessStat.threads(ProcessHandle.current().pid())) {
      if (thread.name().startsWith("C1 Compiler") || thread.name().startsWith("C2 Compiler")) {
        sum += thread.cpuTicks();
        found = true;
      }
    }
    return found ? sum : -1;
  }
}
