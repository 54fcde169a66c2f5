package io.gpumemd.it.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Share;
import io.gpumemd.it.e2e.DeviceBooks;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.OtherUser;
import io.grpc.ManagedChannel;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * {@code gpumemd --take-over} with real daemon processes on the host backend: a Java worker
 * holding leases, a shared hold and a published name keeps leasing in a loop while the daemon is
 * taken over three times in a row; refused take-overs leave the running daemon serving; a
 * running daemon SIGKILLed mid-hand-over leaves a successor that starts fresh and says so.
 */
class TakeOverTest {
  /** Grace for a reattaching client, as a production daemon has it (the tests' 500 ms is for lost-session tests). */
  private static final String[] FLAGS = {"--keepalive-grace-ms", "5000"};

  private Path dir;
  private final List<DaemonProcess> daemons = new ArrayList<>();

  @BeforeEach
  void directory() throws Exception {
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-takeover-");
  }

  @AfterEach
  void cleanUp() throws Exception {
    daemons.forEach(DaemonProcess::close);
    try (var walk = Files.walk(dir)) {
      walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }

  private DaemonProcess start(String... extra) {
    List<String> flags = new ArrayList<>(List.of(FLAGS));
    flags.addAll(List.of(extra));
    DaemonProcess d = DaemonProcess.startIn(dir, flags.toArray(String[]::new));
    daemons.add(d);
    return d;
  }

  @Test
  void workerCarriesOnAcrossThreeTakeOvers_sameSessions_sameBytes_noIdTwice() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient owner = GpuMemClient.connect(daemon.unixTarget());
         GpuMemClient holder = GpuMemClient.connect(daemon.unixTarget())) {
      String ownerSession = owner.sessionId();
      String holderSession = holder.sessionId();
      Lease shared = owner.lease(0, 1 << 20);
      fill(shared, (byte) 0x31);
      Share share = shared.share();
      Lease hold = holder.attach(share.token());
      Lease named = owner.lease(1, 3 << 20);
      fill(named, (byte) 0x32);
      owner.publish(named, "weights");
      Lease byName = holder.lookup("weights");
      try (LeaseLoop loop = LeaseLoop.start(owner, 2)) {
        loop.awaitMore(200, 30_000);
        List<Integer> pids = new ArrayList<>();
        for (int round = 1; round <= 3; round++) {
          DaemonProcess next = start("--take-over");
          assertEquals(0, daemon.awaitExit(30_000), "round " + round + ": the old daemon did not exit 0:\n"
              + daemon.output());
          assertTrue(daemon.output().contains("handed over to pid " + next.process().pid()), daemon.output());
          assertTrue(next.output().contains("Took over from pid " + daemon.process().pid()), next.output());
          pids.add((int) next.process().pid());
          daemon = next;
          loop.awaitMore(200, 30_000);
        }
        loop.stopAndAwait();
        assertEquals(List.of(), loop.failures(), "calls failed across the take-overs");
        assertTrue(loop.daemonServed() > 0, "no lease came from the daemons");
        assertTrue(loop.leases() >= 800, loop.leases() + " leases");
      }
      assertEquals(ownerSession, owner.sessionId(), "the owner's session was not resumed");
      assertEquals(holderSession, holder.sessionId(), "the holder's session was not resumed");
      assertFalse(owner.sessionLost() || holder.sessionLost());
      assertBytes(shared, (byte) 0x31);
      assertBytes(hold, (byte) 0x31);
      assertBytes(named, (byte) 0x32);
      assertBytes(byName, (byte) 0x32);
      // The successor's books hold exactly what the clients hold: 2 leases and 2 holds in use,
      // and the owner's cache tier (closed leases it keeps, still its leases).
      try (Admin admin = new Admin(daemon)) {
        assertEquals(4 + owner.stats().cachedBlocks() + holder.stats().cachedBlocks(), admin.leases(), "the final daemon's leases");
        fill(hold, (byte) 0x33); // a write through the hold reaches the lease: one memory
        assertBytes(shared, (byte) 0x33);
        hold.close();
        byName.close();
        shared.close();
        named.close();
        share.close();
        owner.unpublish("weights");
      }
    }
    // Both clients closed: their sessions ended on the last daemon, everything came back.
    try (Admin admin = new Admin(daemon)) {
      for (int device = 0; device < 2; device++) {
        DeviceBooks.assertBalanced(admin.awaitLeased(device, 0));
        admin.trim(device);
        // A segment this JVM was sent the descriptor of goes once the daemon has seen (in /proc,
        // within a second) that the process maps it no more.
        DeviceStats d = admin.awaitReserved(device, 0);
        assertEquals(0, d.getReservedBytes(), "device " + device + " after a trim: " + d);
      }
    }
  }

  @Test
  void refusedTakeOver_leavesTheRunningDaemonServing() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      Lease big = client.lease(0, 200L << 20); // more than the taker's budget below
      fill(big, (byte) 0x41);
      String session = client.sessionId();
      Process taker = new ProcessBuilder(takerCommand("--host-device-bytes", "64MiB"))
          .redirectErrorStream(true).start();
      String out = new String(taker.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(taker.waitFor(60, TimeUnit.SECONDS));
      assertEquals(1, taker.exitValue(), out);
      assertTrue(out.contains("take-over refused by the running daemon") && out.contains("budget")
          && out.contains("--device-limit-bytes"), out);
      assertTrue(daemon.process().isAlive());
      assertTrue(daemon.output().contains("refused"), daemon.output());
      // Untouched: the same session leases on, its bytes are there.
      Lease more = client.lease(0, 1 << 20);
      more.close();
      assertEquals(session, client.sessionId());
      assertBytes(big, (byte) 0x41);
      big.close();
    }
  }

  /**
   * A session asleep keeps its contents in the running daemon's host memory, which cannot pass
   * to another process: the take-over is refused naming the session, and nothing changes (the
   * session wakes with its bytes).
   */
  @Test
  void sleepingSession_refusesTheTakeOver_untilItWakes() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      Lease weights = client.lease(0, 8 << 20);
      fill(weights, (byte) 0x5c);
      String session = client.sessionId();
      client.sleep(1);
      Process taker = new ProcessBuilder(takerCommand()).redirectErrorStream(true).start();
      String out = new String(taker.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(taker.waitFor(60, TimeUnit.SECONDS));
      assertEquals(1, taker.exitValue(), out);
      assertTrue(out.contains("take-over refused by the running daemon") && out.contains("sleep")
          && out.contains(session.substring(0, 8)), out);
      assertTrue(daemon.process().isAlive());

      client.wake();
      assertBytes(weights, (byte) 0x5c);
      assertEquals(session, client.sessionId());
      weights.close();
    }
  }

  /**
   * A daemon that offers no take-over socket cannot be taken over, and its socket is never
   * replaced: the would-be successor, finding nobody to take over from, refuses the live socket
   * as a fresh start does.
   */
  @Test
  void daemonWithoutTakeOverSocket_keepsItsSocket() throws Exception {
    DaemonProcess daemon = start("--take-over-socket", "none");
    Process taker = new ProcessBuilder(takerCommand()).redirectErrorStream(true).start();
    String out = new String(taker.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(taker.waitFor(60, TimeUnit.SECONDS));
    assertEquals(1, taker.exitValue(), out);
    assertTrue(out.contains("no daemon answers") && out.contains("is in use by a running process"), out);
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      client.lease(0, 4096).close();
    }
    assertTrue(daemon.process().isAlive());
  }

  @Test
  void takerUnderAnotherUid_isRefused() throws Exception {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to start the taker as another uid");
    DaemonProcess daemon = start();
    OtherUser.openUp(dir);
    // A socket directory it may bind in, and an shm-dir of its own: what stops it must be the
    // take-over socket.
    Files.setPosixFilePermissions(dir, java.nio.file.attribute.PosixFilePermissions.fromString("rwxrwxrwx"));
    Path shm = Files.createDirectory(dir.resolve("shm-nobody"));
    Files.setAttribute(shm, "unix:uid", OtherUser.NOBODY);
    List<String> command = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
        "io.gpumemd.server.Main");
    List<String> flags = takerCommand("--shm-dir", shm.toString());
    command.addAll(flags.subList(DaemonProcess.javaCommand("io.gpumemd.server.Main").size(), flags.size()));
    Process taker = new ProcessBuilder(command).redirectErrorStream(true).start();
    String out = new String(taker.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(taker.waitFor(60, TimeUnit.SECONDS));
    assertEquals(1, taker.exitValue(), out);
    assertTrue(out.contains("permission denied") || out.contains("only uid"), out);
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      client.lease(0, 4096).close();
    }
    assertTrue(daemon.process().isAlive());
  }

  /**
   * The other way round: root may connect to any socket, so the daemon (uid 65534) itself must
   * tell the kernel's word on the peer (SO_PEERCRED) from its own uid, and refuse. (A root taker
   * refuses such a holder itself before it says hello, see {@link TakeOverAttackTest}; here root
   * speaks the protocol by hand, as a taker that skipped that check would.)
   */
  @Test
  void takerUnderAnotherUid_isRefusedByTheDaemon_evenWhereItCanConnect() throws Exception {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to start the daemon as another uid");
    OtherUser.openUp(dir);
    Files.setPosixFilePermissions(dir, java.nio.file.attribute.PosixFilePermissions.fromString("rwxrwxrwx"));
    List<String> command = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
        "io.gpumemd.server.Main");
    List<String> flags = takerCommand();
    flags.remove("--take-over");
    command.addAll(flags.subList(DaemonProcess.javaCommand("io.gpumemd.server.Main").size(), flags.size()));
    Process daemon = new ProcessBuilder(command).redirectErrorStream(true).start();
    try {
      ProcessOutput log = ProcessOutput.of(daemon);
      assertTrue(log.await("gpumemd ready", 60_000), log.text());
      try (TakeOverPeer root = TakeOverPeer.connect(dir.resolve("gpumemd.sock.takeover"))) {
        try {
          root.send(io.gpumemd.proto.takeover.v1.TakeOverFrame.newBuilder().setHello(TakeOverPeer.hostHello()).build());
        } catch (java.io.IOException e) {
          // The daemon refuses another uid without reading a byte of it, and closes: a Hello
          // written after that finds no reader (EPIPE). Its refusal waits here all the same.
        }
        io.gpumemd.proto.takeover.v1.TakeOverFrame answer = root.receive();
        assertTrue(answer != null && answer.hasRefusal()
            && answer.getRefusal().getReason().contains("serves only uid 65534"), String.valueOf(answer));
      }
      assertTrue(log.await("Take-over refused: pid", 10_000), log.text());
      assertTrue(daemon.isAlive(), log.text());
    } finally {
      daemon.destroyForcibly();
      daemon.waitFor(10, TimeUnit.SECONDS);
    }
  }

  @Test
  void runningDaemonKilledMidHandOver_successorStartsFreshAndSaysSo() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      Lease lease = client.lease(0, 1 << 20);
      String before = client.sessionId();
      // Stopped, the daemon still has its socket: the successor connects and asks, and nobody
      // answers; then it dies without a word.
      new ProcessBuilder("kill", "-STOP", Long.toString(daemon.process().pid())).start().waitFor();
      Process taker = new ProcessBuilder(takerCommand()).redirectErrorStream(true).start();
      ProcessOutput out = ProcessOutput.of(taker);
      // The successor has connected and sent its Hello once it blocks reading the answer.
      KernelWaits.awaitBlockedOnUnixRead(taker.pid());
      daemon.process().destroyForcibly();
      assertTrue(daemon.process().waitFor(10, TimeUnit.SECONDS));
      assertTrue(out.await("gpumemd ready", 60_000), out.text());
      assertTrue(out.text().contains("went away before its state was complete: starting fresh"), out.text());
      // The client finds its session gone, and goes on with a new one.
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
      while (!lease.isLost() && System.nanoTime() < deadline) {
        Thread.sleep(20);
      }
      assertTrue(lease.isLost());
      Lease next = client.lease(0, 4096);
      assertNotEquals(before, client.sessionId());
      next.close();
      taker.destroy();
      assertTrue(taker.waitFor(30, TimeUnit.SECONDS));
    }
  }

  /**
   * A dying process closes its descriptors one by one: the running daemon's take-over connection
   * may close while its other sockets still accept. A stand-in predecessor (a Python process)
   * does that slowly on purpose: it reads the Hello's first bytes, closes the connection, and
   * keeps both listening sockets for another second before it exits. The successor starts fresh
   * once the process is gone, instead of refusing sockets that a dead daemon seemed to hold.
   */
  @Test
  void predecessorWhoseSocketsOutliveItsTakeOverConnection_isWaitedFor_thenTheSuccessorStartsFresh()
      throws Exception {
    Assumptions.assumeTrue(Files.isExecutable(Path.of("/usr/bin/python3")), "needs /usr/bin/python3");
    String script = String.join("\n",
        "import socket, sys, time",
        "def listen(p):",
        "    s = socket.socket(socket.AF_UNIX)",
        "    s.bind(p)",
        "    s.listen(8)",
        "    return s",
        "main = listen(sys.argv[1] + '/gpumemd.sock')",
        "take = listen(sys.argv[1] + '/gpumemd.sock.takeover')",
        "print('listening', flush=True)",
        "c, _ = take.accept()",
        "c.recv(4)",
        "c.close()",
        "print('hung up', flush=True)",
        "time.sleep(1.0)");
    Process predecessor = new ProcessBuilder("/usr/bin/python3", "-c", script, dir.toString())
        .redirectErrorStream(true).start();
    Process taker = null;
    try {
      ProcessOutput said = ProcessOutput.of(predecessor);
      assertTrue(said.await("listening", 10_000), said.text());
      taker = new ProcessBuilder(takerCommand()).redirectErrorStream(true).start();
      ProcessOutput out = ProcessOutput.of(taker);
      assertTrue(said.await("hung up", 60_000), said.text() + out.text());
      assertTrue(out.await("gpumemd ready", 60_000), out.text());
      assertTrue(out.text().contains("went away before its state was complete: starting fresh"), out.text());
      // Without the wait the successor refused the sockets as in use by a running process, and
      // was never ready; the predecessor has exited by now (the JVM may not have reaped it yet).
      assertTrue(predecessor.waitFor(10, TimeUnit.SECONDS), said.text());
      try (GpuMemClient client = GpuMemClient.connect("unix://" + dir.resolve("gpumemd.sock"))) {
        client.lease(0, 4096).close();
      }
    } finally {
      predecessor.destroyForcibly();
      if (taker != null) {
        taker.destroy();
        assertTrue(taker.waitFor(30, TimeUnit.SECONDS));
      }
    }
  }

  private List<String> takerCommand(String... extra) {
    List<String> command = new ArrayList<>(DaemonProcess.javaCommand("io.gpumemd.server.Main"));
    command.addAll(List.of(io.gpumemd.server.testing.TestDaemon.defaultFlags(dir)));
    command.addAll(List.of(FLAGS));
    command.add("--take-over");
    command.addAll(List.of(extra));
    return command;
  }

  static void fill(Lease lease, byte value) {
    ByteBuffer b = lease.buffer();
    for (int i = 0; i < b.capacity(); i += 4096) {
      b.put(i, value);
    }
    b.put(b.capacity() - 1, value);
  }

  static void assertBytes(Lease lease, byte value) {
    ByteBuffer b = lease.buffer();
    for (int i = 0; i < b.capacity(); i += 4096) {
      assertEquals(value, b.get(i), "byte " + i + " of " + lease);
    }
    assertEquals(value, b.get(b.capacity() - 1));
  }

  /** Admin calls to a daemon over its socket. */
  static final class Admin implements AutoCloseable {
    private final EpollEventLoopGroup group = new EpollEventLoopGroup(1);
    private final ManagedChannel channel;
    private final AdminGrpc.AdminBlockingStub stub;

    Admin(DaemonProcess daemon) {
      channel = NettyChannelBuilder.forAddress(new DomainSocketAddress(daemon.dir().resolve("gpumemd.sock").toString()))
          .eventLoopGroup(group).channelType(EpollDomainSocketChannel.class).usePlaintext().build();
      stub = AdminGrpc.newBlockingStub(channel).withDeadlineAfter(30, TimeUnit.SECONDS);
    }

    DeviceStats stats(int device) {
      return stub.getStats(GetStatsRequest.newBuilder().setDevice(device).build()).getDevices(0);
    }

    int leases() {
      return stub.listLeases(ListLeasesRequest.newBuilder().build()).getLeasesCount();
    }

    DeviceStats awaitLeased(int device, long bytes) throws InterruptedException {
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      DeviceStats d = stats(device);
      while (d.getLeasedBytes() + d.getClientCachedBytes() != bytes && System.nanoTime() < deadline) {
        Thread.sleep(20);
        d = stats(device);
      }
      assertEquals(bytes, d.getLeasedBytes() + d.getClientCachedBytes(), "device " + device + ": " + d);
      return d;
    }

    DeviceStats awaitReserved(int device, long bytes) throws InterruptedException {
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      DeviceStats d = stats(device);
      while (d.getReservedBytes() != bytes && System.nanoTime() < deadline) {
        Thread.sleep(20);
        d = stats(device);
      }
      return d;
    }

    void trim(int device) {
      stub.trim(TrimRequest.newBuilder().setDevice(device).setKeepBytes(0).build());
    }

    @Override
    public void close() throws InterruptedException {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
      group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    }
  }
}
