package io.gpumemd.it.hardening;

import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.ResultProcess;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * An attacker main run as another uid (65534, {@link OtherUser#NOBODY}, unless told) in its own JVM, its output read
 * as it comes (so that a chatty attacker never blocks on a full pipe) and parsed by {@link
 * ResultProcess} once it ends. Thread-safe.
 */
final class AttackerProcess implements AutoCloseable {
  private final String name;
  private final Process process;
  private final CompletableFuture<Map<String, String>> result;

  private AttackerProcess(String name, Process process) {
    this.name = name;
    this.process = process;
    this.result = CompletableFuture.supplyAsync(() -> {
      try {
        return ResultProcess.parse(process);
      } catch (Exception e) {
        throw new IllegalStateException(e);
      } catch (AssertionError e) {
        throw new IllegalStateException(name + ": " + e.getMessage(), e);
      }
    });
  }

  static AttackerProcess start(Class<?> main, String... args) throws Exception {
    return start(OtherUser.NOBODY, main, args);
  }

  /** Runs {@code main} as {@code uid} (group the same number, no supplementary groups). */
  static AttackerProcess start(int uid, Class<?> main, String... args) throws Exception {
    List<String> command = new ArrayList<>(OtherUser.javaCommand(uid, uid, List.of(), main.getName()));
    command.addAll(List.of(args));
    String name = "uid " + uid + " " + main.getSimpleName() + " " + String.join(" ", args);
    return new AttackerProcess(name, new ProcessBuilder(command).redirectErrorStream(true).start());
  }

  boolean isAlive() {
    return process.isAlive();
  }

  String name() {
    return name;
  }

  /** Waits up to {@code seconds} for the process to end and returns its RESULT (key {@code output}: all it printed). */
  Map<String, String> result(long seconds) throws Exception {
    try {
      return result.get(seconds, TimeUnit.SECONDS);
    } catch (ExecutionException e) {
      throw new AssertionError(name + " failed: " + e.getCause().getMessage(), e.getCause());
    }
  }

  @Override
  public void close() {
    process.destroyForcibly();
  }
}
