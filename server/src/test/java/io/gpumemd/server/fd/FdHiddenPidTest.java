package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * A daemon in a PID namespace of its own (as in a pod without {@code hostPID}) and this JVM, a
 * process it cannot see, as its fd-channel peer: the kernel gives the peer's pid as 0, so the
 * descriptors sent to it cannot be tracked to its process (see {@link DescriptorPins}). The
 * daemon says so at WARN ({@link DescriptorPins}), once; a daemon that sees its peer says nothing of it.
 */
class FdHiddenPidTest {
  private static final List<String> OWN_PID_NAMESPACE =
      List.of("unshare", "--pid", "--fork", "--kill-child", "--mount-proc");
  private static final String WARNING = "connected from a PID namespace this daemon cannot see";

  @BeforeAll
  static void needUnshare() throws Exception {
    Assumptions.assumeTrue(OtherUser.available(), "needs root to start a daemon in a PID namespace of its own");
    List<String> command = new ArrayList<>(OWN_PID_NAMESPACE);
    command.add("true");
    Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
    Assumptions.assumeTrue(p.waitFor(10, TimeUnit.SECONDS) && p.exitValue() == 0,
        "unshare --pid cannot make a PID namespace here");
  }

  @Test
  void aPeerTheDaemonCannotSee_isNamedAtWarnOnce() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.startUnder(OWN_PID_NAMESPACE, "--host-segments", "fd")) {
      askTwice(daemon);
      assertTrue(daemon.awaitLine(WARNING, 5000), daemon.output());
      assertTrue(daemon.output().contains("pid 0"), daemon.output());
      assertEquals(1, daemon.output().lines().filter(l -> l.contains(WARNING)).count(), "logged once:\n"
          + daemon.output());
    }
  }

  @Test
  void aPeerTheDaemonSees_isNotNamed() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--host-segments", "fd")) {
      askTwice(daemon);
      // The refusal of the unknown session is logged after the connection was accepted.
      assertTrue(daemon.awaitLine("fd channel: refused", 5000), daemon.output());
      assertFalse(daemon.output().contains(WARNING), daemon.output());
    }
  }

  /** Two connections, each asking for a segment of a session that does not exist (refused NOT_FOUND). */
  private static void askTwice(DaemonProcess daemon) throws Exception {
    for (int i = 1; i <= 2; i++) {
      try (FdTestClient client = new FdTestClient(daemon.dir().resolve("gpumemd.sock.fd"))) {
        client.send(FdRequest.newBuilder().setRequestId(i).setSessionId("no-such-session").setSegmentId(1).build());
        assertEquals(FdReply.ResultCase.REFUSED, client.receive().reply().getResultCase());
      }
    }
  }
}
