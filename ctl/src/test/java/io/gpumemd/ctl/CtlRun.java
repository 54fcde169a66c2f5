package io.gpumemd.ctl;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Map;

/** gpumemctl run in-process with its output captured: exit code, stdout, stderr. */
record CtlRun(int code, String out, String err) {
  static CtlRun of(String... args) {
    return withEnv(Map.of(), args);
  }

  /** With {@code env} as the whole environment (GPUMEMD_TARGET), not the test JVM's. */
  static CtlRun withEnv(Map<String, String> env, String... args) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int code;
    try (PrintStream o = new PrintStream(out, true, StandardCharsets.UTF_8);
         PrintStream e = new PrintStream(err, true, StandardCharsets.UTF_8)) {
      code = GpuMemCtl.run(args, o, e, env::get, false);
    }
    return new CtlRun(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
  }
}
