package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.Ticker;
import io.gpumemd.common.unix.Pidfd;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.pool.DescriptorHolder;
import io.gpumemd.server.testing.TestDaemon;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link DescriptorPins} with peers it cannot see by pid, as a daemon in a PID namespace of its
 * own sees every client: real peer processes on a real Unix socket, their {@link Caller}s named
 * pid 0 as {@code SO_PEERCRED} names them there (this JVM sees them, so the pid is set here, as
 * {@code FdHiddenPidTest} and {@code test_pinning.py} show the kernel doing). The pins follow
 * them by pidfd: one per process, bounded per tenant, let go when a process keeps nothing, and a
 * holder ends when its process exits, not before.
 */
class DescriptorPinsHiddenTest {
  private static final String TENANT = "uid:65534";
  @TempDir Path dir;
  private TestDaemon daemon;
  private DescriptorPins pins;
  private int listening = -1;
  private final List<Process> peers = new ArrayList<>();
  private final List<Integer> sockets = new ArrayList<>();

  @BeforeEach
  void start() throws Exception {
    // No cache: a released segment is evicted at once, and a process that may map it pins it.
    daemon = TestDaemon.start("--host-segments", "fd", "--retention-cap-bytes", "0");
    pins = new DescriptorPins(daemon.server().pools(), Ticker.system(), 2);
    listening = UnixSockets.listen(dir.resolve("s.sock").toString());
  }

  @AfterEach
  void stop() {
    peers.forEach(Process::destroyForcibly);
    sockets.forEach(UnixSockets::closeQuietly);
    UnixSockets.closeQuietly(listening);
    daemon.close();
  }

  /** A process of {@code tenant} that connects {@code times} times; its connections' daemon ends, each with its Caller. */
  private List<Connection> peer(String tenant, int times) throws Exception {
    String script = "import socket,time\n"
        + "s=[socket.socket(socket.AF_UNIX) for _ in range(" + times + ")]\n"
        + "[x.connect('" + dir.resolve("s.sock") + "') for x in s]\n"
        + "time.sleep(60)\n";
    peers.add(new ProcessBuilder("python3", "-c", script).redirectErrorStream(true).start());
    List<Connection> connections = new ArrayList<>();
    for (int i = 0; i < times; i++) {
      int socket = UnixSockets.accept(listening);
      sockets.add(socket);
      connections.add(new Connection(new Caller(tenant, "uid 65534 gid 65534 pid 0", false, 65534, 65534, 0, "pid 0"),
          socket));
    }
    return connections;
  }

  private record Connection(Caller caller, int socket) {}

  private String connect(Connection c) {
    return pins.connected(c.caller(), c.socket());
  }

  private static void assumePidfs(Connection c) throws Exception {
    Pidfd probe = Pidfd.ofPeer(c.socket());
    Assumptions.assumeTrue(probe != null, "this kernel names no peer by pidfd on pidfs (Linux 6.9 and later do)");
    probe.close();
  }

  @Test
  void oneProcessIsFollowedOnce_aTenantsProcessesAreBounded_andOneThatKeepsNothingIsLetGo() throws Exception {
    List<Connection> first = peer(TENANT, 2);
    assumePidfs(first.get(0));
    assertNull(connect(first.get(0)));
    assertNull(connect(first.get(1)));
    assertEquals(1, pins.hiddenProcesses(TENANT), "two connections of one process");

    Connection second = peer(TENANT, 1).get(0);
    assertNull(connect(second));
    Connection third = peer(TENANT, 1).get(0);
    String refused = connect(third);
    assertNotNull(refused, "a third process of the tenant, past its bound of 2");
    assertTrue(refused.contains("tenant " + TENANT + " has 2 processes in PID namespaces this daemon cannot see"),
        refused);
    assertEquals(2, pins.hiddenProcesses(TENANT));
    assertNull(connect(peer("uid:1", 1).get(0)), "another tenant has a bound of its own");

    // The first process ends its connections holding nothing: its pidfd goes, and room comes back.
    pins.disconnected(first.get(0).caller(), true);
    pins.disconnected(first.get(1).caller(), true);
    pins.sweep();
    assertEquals(1, pins.hiddenProcesses(TENANT));
    assertNull(connect(third));
    assertEquals(2, pins.hiddenProcesses(TENANT));
  }

  @Test
  void whatAProcessWasSent_staysOnTheBooksAfterItsSession_untilTheProcessExits() throws Exception {
    Connection c = peer(TENANT, 1).get(0);
    assumePidfs(c);
    Caller hidden = c.caller();
    String session = daemon.server().registry().open(hidden, "hidden", 0, -1).id();
    LeaseRecord lease = daemon.server().registry().lease(hidden, session, 0, 4096, false, "", false);
    long segment = lease.block().segmentId();

    assertNull(connect(c));
    pins.granted(hidden, session, segment);
    String holder = only(daemon.server().pools().descriptorHolders());
    DescriptorHolder parsed = DescriptorHolder.parse(holder);
    assertEquals(0, parsed.pid());
    assertEquals(TENANT, parsed.tenant());

    // The process ends its session and its connection, and lives on: its /proc is out of sight,
    // so it keeps the segment, charged to its tenant.
    daemon.server().registry().close(hidden, session);
    pins.disconnected(hidden, true);
    pins.sweep();
    assertEquals(holder, only(daemon.server().pools().descriptorHolders()));
    assertEquals(1, pins.hiddenProcesses(TENANT));
    assertTrue(daemon.server().pools().pinnedBytes(TENANT) >= 4096);

    // It exits: the holder ends, and the pidfd goes.
    peers.get(0).destroyForcibly().waitFor(10, TimeUnit.SECONDS);
    await(() -> {
      pins.sweep();
      // Its pidfd goes at the sweep that finds it exited, or at the next (it may exit between the two looks).
      return daemon.server().pools().descriptorHolders().isEmpty() && pins.hiddenProcesses(TENANT) == 0;
    }, "the exited process's holder ended and its pidfd closed");
    assertEquals(0, daemon.server().pools().pinnedBytes(TENANT));
  }

  private static String only(java.util.Set<String> keys) {
    assertEquals(1, keys.size(), keys.toString());
    return keys.iterator().next();
  }

  /** Sweeps (a full one runs once a second) until {@code condition}, 10 s at most. */
  private static void await(BooleanSupplier condition, String what) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!condition.getAsBoolean()) {
      assertTrue(System.nanoTime() < deadline, what + " within 10 s");
      Thread.sleep(50);
    }
  }
}
