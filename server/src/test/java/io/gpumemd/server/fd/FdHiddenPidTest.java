package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.unix.Pidfd;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A daemon in a PID namespace of its own (as in a pod without {@code hostPID}) and this JVM, a
 * process it cannot see, as its fd-channel peer: the kernel gives the peer's pid as 0. Where
 * the kernel names peers by pidfd on pidfs (Linux 6.9), the daemon follows this process so, once
 * over two connections, and warns of nothing; on an older kernel it cannot, and says so at WARN,
 * once (see {@link DescriptorPins}). A daemon that sees its peer does neither. What such a
 * process keeps is charged to its tenant: {@code python/tests/test_pinning.py} runs the pinning
 * loop against such a daemon, as another uid.
 */
class FdHiddenPidTest {
  private static final List<String> OWN_PID_NAMESPACE =
      List.of("unshare", "--pid", "--fork", "--kill-child", "--mount-proc");
  private static final String WARNING = "connected from a PID namespace this daemon cannot see";
  private static final String FOLLOWING = "by pidfd inode";

  @TempDir static Path dir;

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
  void aPeerTheDaemonCannotSee_isFollowedByPidfdOnce_orNamedAtWarnOnce() throws Exception {
    boolean pidfs = kernelNamesPeersByPidfd();
    try (DaemonProcess daemon = DaemonProcess.startUnder(OWN_PID_NAMESPACE, "--host-segments", "fd",
        "--log-level", "DEBUG")) {
      askTwice(daemon);
      assertTrue(daemon.awaitLine(pidfs ? FOLLOWING : WARNING, 5000), daemon.output());
      assertTrue(daemon.output().contains("pid 0"), daemon.output());
      assertEquals(1, daemon.output().lines().filter(l -> l.contains(pidfs ? FOLLOWING : WARNING)).count(),
          "once over two connections:\n" + daemon.output());
      assertFalse(daemon.output().contains(pidfs ? WARNING : FOLLOWING), daemon.output());
    }
  }

  @Test
  void aPeerTheDaemonSees_isNeitherFollowedByPidfdNorNamed() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--host-segments", "fd", "--log-level", "DEBUG")) {
      askTwice(daemon);
      // The refusal of the unknown session is logged after the connection was accepted.
      assertTrue(daemon.awaitLine("fd channel: refused", 5000), daemon.output());
      assertFalse(daemon.output().contains(WARNING), daemon.output());
      assertFalse(daemon.output().contains(FOLLOWING), daemon.output());
    }
  }

  /** Whether this kernel gives a Unix socket's peer as a pidfd on pidfs (what the daemon follows hidden peers by). */
  private static boolean kernelNamesPeersByPidfd() throws Exception {
    int listening = UnixSockets.listen(dir.resolve("probe.sock").toString());
    int near = UnixSockets.connect(dir.resolve("probe.sock").toString(), 5000);
    int far = UnixSockets.accept(listening);
    try (Pidfd pidfd = Pidfd.ofPeer(far)) {
      return pidfd != null;
    } finally {
      UnixSockets.closeQuietly(far);
      UnixSockets.closeQuietly(near);
      UnixSockets.closeQuietly(listening);
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
