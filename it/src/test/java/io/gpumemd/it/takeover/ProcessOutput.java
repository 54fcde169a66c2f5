package io.gpumemd.it.takeover;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

/** A process's output as it comes, read by a thread of its own. Thread-safe. */
final class ProcessOutput {
  private final StringBuilder text = new StringBuilder();

  private ProcessOutput() {}

  static ProcessOutput of(Process process) {
    ProcessOutput out = new ProcessOutput();
    Thread t = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          synchronized (out) {
            out.text.append(line).append('\n');
            out.notifyAll();
          }
        }
      } catch (IOException e) {
        // process gone
      }
    }, "process-output");
    t.setDaemon(true);
    t.start();
    return out;
  }

  synchronized String text() {
    return text.toString();
  }

  /** Waits until the output contains {@code what}; false after {@code millis}. */
  synchronized boolean await(String what, long millis) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    while (text.indexOf(what) < 0) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        return false;
      }
      TimeUnit.NANOSECONDS.timedWait(this, left);
    }
    return true;
  }
}
