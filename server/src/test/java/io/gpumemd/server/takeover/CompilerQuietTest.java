package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.lang.reflect.Method;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;

/**
 * The wait for this JVM's JIT compiler threads, against the real JIT: a workload that keeps
 * setting off compilations (a hot method in ever new copies of a class, each compiled apart)
 * keeps them busy, and they go idle once it stops.
 */
class CompilerQuietTest {

  /** Compiled afresh in every copy: each copy is a class of its own to the JIT. */
  public static final class HotLoop {
    public static long run(long n) {
      long x = n;
      for (int i = 0; i < 64; i++) {
        x = x * 6364136223846793005L + 1442695040888963407L ^ (x >>> 17);
      }
      return x;
    }
  }

  /** Defines {@link HotLoop} again in a loader of its own. */
  private static final class CopyLoader extends ClassLoader {
    CopyLoader() {
      super(CompilerQuietTest.class.getClassLoader());
    }

    Class<?> copy(byte[] bytes) {
      return defineClass(HotLoop.class.getName(), bytes, 0, bytes.length);
    }
  }

  @Test
  void findsThisJvmsCompilerThreads() {
    // -1 would mean the wait never waits: HotSpot renamed its compiler threads, or /proc is gone.
    assertTrue(CompilerQuiet.compilerTicks() >= 0, "no C1/C2 compiler thread found in /proc/self/task");
  }

  @Test
  void busyWhileCompilationsKeepComing_idleOnceTheyStop() throws Exception {
    byte[] bytes;
    try (InputStream in = HotLoop.class.getResourceAsStream("CompilerQuietTest$HotLoop.class")) {
      bytes = in.readAllBytes();
    }
    AtomicBoolean stop = new AtomicBoolean();
    Thread workload = new Thread(() -> compileCopies(bytes, stop), "compile-workload");
    workload.setDaemon(true);
    long before = CompilerQuiet.compilerTicks();
    workload.start();
    try {
      // Each copy's method is compiled by C1 (and C2, where enabled) within milliseconds of its
      // calls: the compiler threads are never idle for the quiet window meanwhile.
      Thread.sleep(300);
      assertFalse(CompilerQuiet.await(500), "compiler threads counted idle while new code kept coming");
      assertTrue(CompilerQuiet.compilerTicks() > before, "the compiler threads' CPU time did not grow");
    } finally {
      stop.set(true);
      workload.join(TimeUnit.SECONDS.toMillis(10));
    }
    long started = System.nanoTime();
    assertTrue(CompilerQuiet.await(10_000), "compiler threads still busy 10 s after the workload stopped");
    assertTrue(System.nanoTime() - started >= TimeUnit.MILLISECONDS.toNanos(CompilerQuiet.QUIET_MILLIS),
        "idle counted before a whole quiet window passed");
  }

  private static void compileCopies(byte[] bytes, AtomicBoolean stop) {
    long sink = 0;
    // Bounded: 20 s of copies at most, should the test's stop never come.
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    try {
      while (!stop.get() && System.nanoTime() < deadline) {
        Method run = new CopyLoader().copy(bytes).getMethod("run", long.class);
        for (int i = 0; i < 3_000; i++) {
          sink += (long) run.invoke(null, (long) i);
        }
      }
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException(e);
    }
    if (sink == 42) {
      System.out.println(sink); // keeps the results alive
    }
  }
}
