package io.gpumemd.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.config.ConfigException;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.TestDaemon;
import java.util.List;
import org.junit.jupiter.api.Test;

/** TCP beyond loopback: refused in plaintext, unless the operator accepts it with --insecure-tcp and a WARN. */
class TcpExposureTest {
  @Test
  void allInterfaces_withoutTls_doesNotStart() {
    ConfigException e = assertThrows(ConfigException.class, () -> TestDaemon.start("--listen", "0.0.0.0:0").close());
    assertTrue(e.getMessage().startsWith("listen: '0.0.0.0:0' is not a loopback address and has no TLS"), e.getMessage());
    assertTrue(e.getMessage().contains("--insecure-tcp"), e.getMessage());
  }

  @Test
  void allInterfaces_withInsecureTcp_startsWithAWarningThatSaysWhatPeersCanDo() {
    try (LogCapture log = new LogCapture(Listeners.class);
         TestDaemon daemon = TestDaemon.start("--listen", "0.0.0.0:0", "--insecure-tcp")) {
      assertTrue(daemon.server().tcpPort() > 0);
      List<String> warnings = log.messages("WARN");
      assertEquals(1, warnings.size(), warnings.toString());
      String w = warnings.get(0);
      assertTrue(w.startsWith("--insecure-tcp: TCP on 0.0.0.0:" + daemon.server().tcpPort() + " is plaintext"), w);
      assertTrue(w.contains("all of them share the tenant 'anonymous'"), w);
      assertTrue(w.contains("None of them can use the admin verbs"), w);
    }
  }

  @Test
  void loopback_startsWithoutWarning() {
    try (LogCapture log = new LogCapture(Listeners.class); TestDaemon daemon = TestDaemon.start()) {
      assertTrue(daemon.server().tcpPort() > 0);
      assertEquals(List.of(), log.messages("WARN"));
    }
  }
}
