package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestDaemon;
import java.io.File;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** A client that only uses host leases runs with no JCuda (nor its natives) on the classpath. */
class HostOnlyClientTest {
  @Test
  void hostLeases_needNoJCudaOnTheClasspath() throws Exception {
    String full = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    String withoutJCuda = Arrays.stream(full.split(File.pathSeparator))
        .filter(entry -> !entry.contains("jcuda"))
        .collect(Collectors.joining(File.pathSeparator));
    assertTrue(full.contains("jcuda"), "the test classpath should have JCuda to remove: " + full);
    assertFalse(withoutJCuda.contains("jcuda"));

    try (TestDaemon daemon = TestDaemon.start()) {
      List<String> command = DaemonProcess.javaCommand(LeaseHolderMain.class.getName());
      command.set(command.indexOf("-cp") + 1, withoutJCuda);
      command.addAll(List.of(daemon.unixTarget(), "no-jcuda", "3", "8192"));
      Process holder = new ProcessBuilder(command).redirectErrorStream(true).start();
      try {
        assertEquals(3, ProcessKillTest.awaitReady(holder).size());
        assertEquals(3, daemon.server().registry().liveLeases());
      } finally {
        holder.destroyForcibly();
        holder.waitFor(10, TimeUnit.SECONDS);
      }
    }
  }
}
