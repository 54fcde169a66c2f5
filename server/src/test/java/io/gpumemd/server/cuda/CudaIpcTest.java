package io.gpumemd.server.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.testing.DaemonProcess;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Real device memory shared across processes: process A fills a leased block on the GPU and
 * releases it with an IPC event; process B leases the same size, gets a pool hit on the same
 * segment, and reads A's bytes back. Skipped, with the reason, where no GPU is usable.
 */
class CudaIpcTest {
  @BeforeEach
  void needsGpu() {
    String why = CudaAvailability.whyNot();
    if (why != null) {
      System.out.println(why);
    }
    assumeTrue(why == null, why);
  }

  private static Map<String, String> run(String... args) throws Exception {
    List<String> command = DaemonProcess.javaCommand(CudaIpcProcessMain.class.getName());
    command.addAll(List.of(args));
    Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(60, TimeUnit.SECONDS));
    assertEquals(0, p.exitValue(), out);
    String line = out.lines().filter(l -> l.startsWith("RESULT")).findFirst().orElseThrow(() -> new AssertionError(out));
    Map<String, String> result = new HashMap<>();
    for (String kv : line.substring(7).split(" ")) {
      String[] pair = kv.split("=");
      result.put(pair[0], pair[1]);
    }
    return result;
  }

  @Test
  void blockFilledByOneProcess_isReadByAnother_afterItsEvent() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--device-limit-bytes", "1GiB");
    try {
      assertTrue(daemon.output().contains("Backend: cuda"), daemon.output());
      long size = 2L << 20;
      Map<String, String> a = run("write", daemon.unixTarget(), Long.toString(size), "90");
      Map<String, String> b = run("read", daemon.unixTarget(), Long.toString(size));
      assertEquals("false", a.get("hit"));
      assertEquals("true", b.get("hit"));
      assertEquals(a.get("segment"), b.get("segment"));
      assertEquals(a.get("offset"), b.get("offset"));
      assertEquals("90", b.get("first"));
      assertEquals("90", b.get("last"));
      assertEquals("true", b.get("uniform"));
      assertEquals(0, daemon.terminate(20_000), daemon.output());
    } finally {
      daemon.close();
    }
  }
}
