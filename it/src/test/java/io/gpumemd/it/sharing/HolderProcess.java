package io.gpumemd.it.sharing;

import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A {@link SharingClientMain} holder process driven over its stdin and stdout: every wait is
 * bounded, and a process that ends early fails the test with everything it printed.
 * Not thread-safe (one test thread drives it).
 */
final class HolderProcess implements AutoCloseable {
  private static final long WAIT_SECONDS = 60;
  private static final String EOF = "\u0000EOF";

  private final Process process;
  private final Writer stdin;
  private final BlockingQueue<String> lines = new LinkedBlockingQueue<>();
  private final StringBuffer output = new StringBuffer();

  private HolderProcess(Process process) {
    this.process = process;
    this.stdin = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
    Thread pump = new Thread(() -> {
      try (BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = out.readLine()) != null) {
          output.append(line).append('\n');
          lines.add(line);
        }
      } catch (IOException e) {
        // the process ended
      } finally {
        lines.add(EOF);
      }
    }, "holder-pump-" + process.pid());
    pump.setDaemon(true);
    pump.start();
  }

  /** Starts {@code SharingClientMain attach|lookup target key seed}; does not wait for READY. */
  static HolderProcess start(String mode, String target, String key, int seed) throws IOException {
    List<String> command = DaemonProcess.javaCommand(SharingClientMain.class.getName());
    command.addAll(List.of(mode, target, key, Integer.toString(seed)));
    return new HolderProcess(new ProcessBuilder(command).redirectErrorStream(true).start());
  }

  /** Runs a producer ({@code share} or {@code publish}) to completion; its RESULT line's fields. */
  static Map<String, String> produce(String... args) throws Exception {
    return ResultProcess.run(SharingClientMain.class, args);
  }

  /** Waits for the next line starting with {@code prefix}; its {@code key=value} fields. */
  Map<String, String> await(String prefix) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_SECONDS);
    while (true) {
      long left = deadline - System.nanoTime();
      String line = left <= 0 ? null : lines.poll(left, TimeUnit.NANOSECONDS);
      if (line == null) {
        throw new AssertionError("no " + prefix + " line from holder " + process.pid() + " within " + WAIT_SECONDS
            + " s:\n" + output);
      }
      if (line.equals(EOF)) {
        lines.add(EOF);
        throw new AssertionError("holder " + process.pid() + " ended before " + prefix + ":\n" + output);
      }
      if (line.startsWith(prefix)) {
        Map<String, String> fields = new HashMap<>();
        for (String word : line.substring(prefix.length()).trim().split(" ")) {
          String[] kv = word.split("=", 2);
          if (kv.length == 2) {
            fields.put(kv[0], kv[1]);
          }
        }
        return fields;
      }
    }
  }

  /** Sends one command line. */
  void send(String command) throws IOException {
    stdin.write(command + "\n");
    stdin.flush();
  }

  /** Sends a command and waits for its answer line. */
  Map<String, String> ask(String command, String answer) throws Exception {
    send(command);
    return await(answer);
  }

  /** Asks the holder to close its client and exit; fails unless it exits 0 in time. */
  void exit() throws Exception {
    send("exit");
    if (!process.waitFor(WAIT_SECONDS, TimeUnit.SECONDS)) {
      throw new AssertionError("holder " + process.pid() + " did not exit:\n" + output);
    }
    if (process.exitValue() != 0) {
      throw new AssertionError("holder " + process.pid() + " exited " + process.exitValue() + ":\n" + output);
    }
  }

  /** SIGKILL, and wait until it is gone. */
  void kill() throws InterruptedException {
    process.destroyForcibly();
    if (!process.waitFor(WAIT_SECONDS, TimeUnit.SECONDS)) {
      throw new AssertionError("holder " + process.pid() + " survived SIGKILL");
    }
  }

  long pid() {
    return process.pid();
  }

  String output() {
    return output.toString();
  }

  /** Kills the process if it still runs (a failed test). */
  @Override
  public void close() {
    process.destroyForcibly();
    try {
      process.waitFor(WAIT_SECONDS, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
