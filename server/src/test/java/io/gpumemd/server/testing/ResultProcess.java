package io.gpumemd.server.testing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Runs a test client main in its own JVM to completion and parses the one line it prints as
 * {@code RESULT key=value key=value ...}. Fails the test when the process fails or prints none.
 */
public final class ResultProcess {
  private ResultProcess() {}

  public static Map<String, String> run(Class<?> main, String... args) throws Exception {
    List<String> command = DaemonProcess.javaCommand(main.getName());
    command.addAll(List.of(args));
    return parse(new ProcessBuilder(command).redirectErrorStream(true).start());
  }

  /**
   * Waits for a started process (stderr merged into stdout) and parses its RESULT line; the
   * whole output is under the key {@code output}, for failure messages.
   */
  public static Map<String, String> parse(Process p) throws Exception {
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), "process did not end:\n" + out);
    assertEquals(0, p.exitValue(), out);
    String line = out.lines().filter(l -> l.startsWith("RESULT")).findFirst()
        .orElseThrow(() -> new AssertionError("no RESULT line:\n" + out));
    Map<String, String> result = new HashMap<>();
    for (String kv : line.substring("RESULT".length()).trim().split(" ")) {
      String[] pair = kv.split("=", 2);
      result.put(pair[0], pair[1]);
    }
    result.put("output", out);
    return result;
  }
}
