package io.gpumemd.it.takeover;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * Waits for a process to reach a state the kernel reports in /proc, so that tests order real
 * processes by what they are doing rather than by sleeping. Stateless.
 */
final class KernelWaits {
  private KernelWaits() {}

  /**
   * Waits until the main thread of the JVM {@code pid} blocks reading a Unix stream socket (the
   * kernel's wait channel): a successor's, waiting for the running daemon's state. Only the
   * launcher's threads keep the kernel name "java"; every thread a daemon names is called by its
   * name (its rehearsal reads a take-over channel of its own on one).
   */
  static void awaitBlockedOnUnixRead(long pid) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    while (System.nanoTime() < deadline) {
      try (Stream<Path> tasks = Files.list(Path.of("/proc/" + pid + "/task"))) {
        for (Path task : tasks.toList()) {
          try {
            if (Files.readString(task.resolve("comm")).strip().equals("java")
                && Files.readString(task.resolve("wchan")).startsWith("unix_stream")) {
              return;
            }
          } catch (IOException e) {
            // the thread ended
          }
        }
      }
      Thread.sleep(20);
    }
    throw new AssertionError("pid " + pid + " never blocked reading its take-over socket");
  }

  /**
   * Waits until {@code pid} is a zombie whose other threads are gone too: a killed JVM's main
   * thread shows "Z" while its other threads are still exiting, and its sockets close only when
   * the last of them has (a peer writing meanwhile still succeeds).
   */
  static void awaitZombie(long pid) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (System.nanoTime() < deadline) {
      String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
      if (stat.substring(stat.lastIndexOf(')') + 2).startsWith("Z") && threads(pid) <= 1) {
        return;
      }
      Thread.sleep(20);
    }
    throw new AssertionError("pid " + pid + " did not die");
  }

  private static long threads(long pid) throws IOException {
    try (Stream<Path> tasks = Files.list(Path.of("/proc/" + pid + "/task"))) {
      return tasks.count();
    }
  }
}
