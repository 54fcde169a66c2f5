package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import java.util.Map;
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
    return ResultProcess.run(CudaIpcProcessMain.class, args);
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
