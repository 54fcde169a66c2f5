package io.gpumemd.it.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.takeover.v1.Abort;
import io.gpumemd.proto.takeover.v1.LeaseState;
import io.gpumemd.proto.takeover.v1.Ready;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.server.takeover.TakeOverState;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.EventStream;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestChannel;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The take-over socket under attack (issue 32), with real processes: a squatter under uid 65534
 * on the take-over path, a socket in a directory others may write to or a file another uid owns
 * (each refused by the taker before it says a word), a holder SIGKILLed right after it sent its
 * state (the successor serves the sessions), a 5-byte frame announcing 1 GiB (the daemon serves
 * on), a successor that says hello and falls silent (the gate reopens), and the temporary sockets
 * of a start SIGKILLed midway (removed by the next start when their pid is dead).
 */
class TakeOverAttackTest {
  private static final String[] FLAGS = {"--keepalive-grace-ms", "5000"};

  private Path dir;
  private final List<DaemonProcess> daemons = new ArrayList<>();
  private final List<Process> processes = new ArrayList<>();

  @BeforeEach
  void directory() throws Exception {
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-takeover-attack-");
  }

  @AfterEach
  void cleanUp() throws Exception {
    daemons.forEach(DaemonProcess::close);
    for (Process p : processes) {
      p.destroyForcibly();
      p.waitFor(10, TimeUnit.SECONDS);
    }
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

  private List<String> daemonCommand(String... extra) {
    List<String> command = new ArrayList<>(DaemonProcess.javaCommand("io.gpumemd.server.Main"));
    command.addAll(List.of(TestDaemon.defaultFlags(dir)));
    command.addAll(List.of(FLAGS));
    command.addAll(List.of(extra));
    return command;
  }

  /**
   * A successor that asks as one of an earlier version does, taking no segments ahead: its Hello
   * is followed by the state, so a test that stops it once it waits decides what it reads next.
   */
  private List<String> takerWithoutSegmentsAhead() {
    List<String> command = daemonCommand("--take-over");
    command.add(1, "-D" + TakeOverState.SEGMENTS_AHEAD_PROPERTY + "=false");
    return command;
  }

  private Process launch(List<String> command) throws IOException {
    Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
    processes.add(p);
    return p;
  }

  /** Runs a taker ({@code --take-over}) to its end; its output. */
  private String takeOverAndExit(int expectedStatus) throws Exception {
    Process taker = launch(daemonCommand("--take-over"));
    CompletableFuture<String> output = CompletableFuture.supplyAsync(() -> {
      try {
        return new String(taker.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      } catch (IOException e) {
        throw new java.io.UncheckedIOException(e);
      }
    });
    // A taker that took over (what these tests refuse) serves on and never exits by itself.
    if (!taker.waitFor(60, TimeUnit.SECONDS)) {
      taker.destroyForcibly();
      throw new AssertionError("the taker still runs:\n" + output.get(30, TimeUnit.SECONDS));
    }
    String out = output.get(30, TimeUnit.SECONDS);
    assertEquals(expectedStatus, taker.exitValue(), out);
    return out;
  }

  private Path takeOverSocket() {
    return dir.resolve("gpumemd.sock.takeover");
  }

  private static void signal(String signal, long pid) throws Exception {
    assertEquals(0, new ProcessBuilder("kill", "-" + signal, Long.toString(pid)).inheritIO().start().waitFor());
  }

  private static void chmod(String mode, Path path) throws Exception {
    assertEquals(0, new ProcessBuilder("chmod", mode, path.toString()).inheritIO().start().waitFor());
  }

  /**
   * Issue 32, item 1: where the socket directory is open to others (sticky, as /tmp is) and no
   * daemon listens on the take-over path, another user can. Root's taker must not take its
   * state, nor even say hello to it.
   */
  @Test
  void squatterUnderAnotherUid_onTheTakeOverPath_isRefusedBeforeHello() throws Exception {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run the squatter as another uid");
    OtherUser.openUp(dir);
    chmod("1777", dir);
    List<String> squat = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
        ForgedHolder.class.getName());
    squat.add(takeOverSocket().toString());
    Process squatter = launch(squat);
    ProcessOutput squatterOut = ProcessOutput.of(squatter);
    assertTrue(squatterOut.await("LISTENING", 60_000), squatterOut.text());

    String out = takeOverAndExit(1);

    assertTrue(out.contains("take-over: refusing the state offered on " + takeOverSocket())
        && out.contains("runs as uid 65534, not as this daemon's uid 0"), out);
    assertTrue(squatterOut.await("CLOSED", 30_000), squatterOut.text());
    assertFalse(squatterOut.text().contains("HELLO"), "the taker spoke to the squatter:\n" + squatterOut.text());
  }

  /** Issue 32, item 1: a directory others may write to without the sticky bit is refused, naming its mode. */
  @Test
  void takeOverSocketInADirectoryOthersMayWrite_isRefused_andTheDaemonServesOn() throws Exception {
    DaemonProcess daemon = start();
    chmod("0777", dir);
    String out = takeOverAndExit(1);
    assertTrue(out.contains("its directory " + dir + " (mode 0777) is writable by others without the sticky bit"),
        out);
    assertServing(daemon);
    assertFalse(daemon.output().contains("Take-over asked by pid"), daemon.output());
  }

  /** Issue 32, item 1: the socket file must be the taker's uid's own, whoever listens on it. */
  @Test
  void takeOverSocketFileOfAnotherUid_isRefused_andTheDaemonServesOn() throws Exception {
    DaemonProcess daemon = start();
    Files.setAttribute(takeOverSocket(), "unix:uid", OtherUser.NOBODY);
    String out = takeOverAndExit(1);
    assertTrue(out.contains("the socket file is owned by uid 65534, not by this daemon's uid 0"), out);
    assertServing(daemon);
  }

  /**
   * Issue 32, item 5: the holder is SIGKILLed right after "State sent", before the successor's
   * Taken. The holder is left a zombie (its parent, {@code sleep}, never reaps it), which "is
   * alive" to ProcessHandle: the successor must go by the protocol (a closed connection with no
   * Refusal), serve, and keep the sessions. The ordering is forced with SIGSTOP, not timing: the
   * holder is stopped while the successor says hello, the successor while the holder sends.
   */
  @Test
  void holderKilledRightAfterStateSent_successorServesAndKeepsTheSessions() throws Exception {
    List<String> holderCommand = daemonCommand();
    String quoted = holderCommand.stream().map(a -> "'" + a.replace("'", "'\\''") + "'")
        .collect(Collectors.joining(" "));
    Process wrapper = launch(List.of("sh", "-c", quoted + " & exec sleep 600"));
    ProcessOutput holderOut = ProcessOutput.of(wrapper);
    assertTrue(holderOut.await("gpumemd ready", 60_000), holderOut.text());
    long holder = ProcessHandle.of(wrapper.pid()).orElseThrow().children().findFirst().orElseThrow().pid();

    try (GpuMemClient client = GpuMemClient.connect("unix://" + dir.resolve("gpumemd.sock"))) {
      Lease lease = client.lease(0, 1 << 20);
      TakeOverTest.fill(lease, (byte) 0x5a);
      String session = client.sessionId();

      signal("STOP", holder);
      Process taker = launch(takerWithoutSegmentsAhead());
      ProcessOutput takerOut = ProcessOutput.of(taker);
      KernelWaits.awaitBlockedOnUnixRead(taker.pid()); // its Hello is sent; it waits for the state
      signal("STOP", taker.pid());
      signal("CONT", holder);
      assertTrue(holderOut.await("State sent to pid " + taker.pid(), 60_000), holderOut.text());
      signal("KILL", holder);
      KernelWaits.awaitZombie(holder);
      signal("CONT", taker.pid());

      assertTrue(takerOut.await("gpumemd ready", 60_000), takerOut.text());
      assertTrue(takerOut.text().contains("went away after sending its state")
          && takerOut.text().contains("Took over from pid " + holder), takerOut.text());
      assertTrue(ProcessHandle.of(holder).map(ProcessHandle::isAlive).orElse(false),
          "the holder should still be an unreaped zombie, else this test proves nothing");

      // The session carries on on the successor: same id, same bytes, new leases.
      Lease next = client.lease(0, 4096);
      next.close();
      assertEquals(session, client.sessionId());
      assertFalse(client.sessionLost());
      TakeOverTest.assertBytes(lease, (byte) 0x5a);
      lease.close();
    }
  }

  /**
   * Found on review (stop 50): the fd channel granted fetches while a hand-over had the gate
   * closed, after the books were exported for the successor. A process's first fetch of a segment
   * there made its holder in the books of the daemon handing over only, so the successor did not
   * know the process holds the segment: it could end its session, keep the segment mapped, and the
   * successor would free it from the tenant's books. Now a tenant process (uid 65534) that fetches
   * while a successor holds the state (stopped by SIGSTOP) gets no answer; once the successor
   * serves, its connection is closed unanswered, and its next fetch, on a new connection, is
   * granted by the successor.
   */
  @Test
  void fetchWhileTheSuccessorHoldsTheState_waitsAndIsGrantedByTheSuccessor() throws Exception {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run a tenant as another uid");
    String[] fd = {"--host-segments", "fd", "--socket-mode", "0666"};
    start(fd);
    OtherUser.openUp(dir);
    List<String> fetcherCommand = new ArrayList<>(OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
        PauseFetchMain.class.getName()));
    fetcherCommand.addAll(List.of(dir.resolve("gpumemd.sock").toString(), dir.resolve("gpumemd.sock.fd").toString()));
    Process fetcher = new ProcessBuilder(fetcherCommand).redirectErrorStream(true).start();
    processes.add(fetcher);
    ProcessOutput fetcherOut = ProcessOutput.of(fetcher);
    assertTrue(fetcherOut.await("LEASED", 60_000), fetcherOut.text());

    List<String> takerCommand = takerWithoutSegmentsAhead();
    takerCommand.addAll(List.of(fd));
    Process taker = launch(takerCommand);
    ProcessOutput takerOut = ProcessOutput.of(taker);
    KernelWaits.awaitBlockedOnUnixRead(taker.pid()); // its Hello is sent; it waits for the state
    signal("STOP", taker.pid());
    DaemonProcess holder = daemons.get(0);
    assertTrue(holder.awaitLine("State sent to pid " + taker.pid(), 60_000), holder.output());

    // The gate is closed and the books are exported: the successor holds them, stopped.
    fetcher.getOutputStream().write("fetch\n".getBytes(StandardCharsets.UTF_8));
    fetcher.getOutputStream().flush();
    assertTrue(fetcherOut.await("SENT", 30_000), fetcherOut.text());
    Thread.sleep(1_000);
    assertFalse(fetcherOut.text().contains("FIRST"), "answered while the successor held the state:\n"
        + fetcherOut.text());

    signal("CONT", taker.pid());
    assertTrue(takerOut.await("gpumemd ready", 60_000), takerOut.text());
    assertTrue(fetcherOut.await("SECOND", 30_000), fetcherOut.text());
    assertTrue(fetcherOut.text().contains("FIRST CLOSED") && fetcherOut.text().contains("SECOND GRANTED"),
        fetcherOut.text());
  }

  /**
   * The other side of item 5: a holder that gave the hand-over up (its successor was silent past
   * the bound) serves on, and a successor whose Taken then fails reads the holder's Refusal and
   * stops, rather than take that EPIPE for a dead holder. The successor is held silent by
   * SIGSTOP while the holder sends, and let go once the holder logs that it gave up.
   */
  @Test
  void holderThatGaveUp_isNotTakenForDead_theSuccessorStops() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      Lease lease = client.lease(0, 1 << 20);
      TakeOverTest.fill(lease, (byte) 0x6b);
      String session = client.sessionId();
      long holder = daemon.process().pid();

      signal("STOP", holder);
      Process taker = launch(takerWithoutSegmentsAhead());
      ProcessOutput takerOut = ProcessOutput.of(taker);
      KernelWaits.awaitBlockedOnUnixRead(taker.pid());
      signal("STOP", taker.pid());
      signal("CONT", holder);
      assertTrue(daemon.awaitLine("State sent to pid " + taker.pid(), 60_000), daemon.output());
      assertTrue(daemon.awaitLine("given up: no answer within 10000 ms of the state", 60_000), daemon.output());
      signal("CONT", taker.pid());

      assertTrue(taker.waitFor(60, TimeUnit.SECONDS), takerOut.text());
      assertEquals(1, taker.exitValue(), takerOut.text());
      assertTrue(takerOut.text().contains("gave the hand-over up and serves on"), takerOut.text());
      assertServing(daemon);
      assertEquals(session, client.sessionId());
      TakeOverTest.assertBytes(lease, (byte) 0x6b);
      lease.close();
    }
  }

  /**
   * Issue 32, item 6: a length that announces 1 GiB, and one byte. The old daemon allocated it
   * and died of an OutOfMemoryError (-XX:+ExitOnOutOfMemoryError, as deployed); now it refuses
   * the frame before allocating and serves on.
   */
  @Test
  void fiveByteFrameAnnouncingOneGib_leavesTheDaemonServing() throws Exception {
    DaemonProcess daemon = start();
    try (TakeOverPeer peer = TakeOverPeer.connect(takeOverSocket())) {
      peer.writeRaw(new byte[] {0x40, 0, 0, 0, 0x0a});
      try {
        assertEquals(null, peer.receive(), "the daemon should close the connection");
      } catch (IOException e) {
        // closed with our fifth byte unread: a reset, as good as a close
      }
    }
    assertTrue(daemon.awaitLine("take-over frame of 1073741824 bytes (expected: at most 65536)", 30_000),
        daemon.output());
    assertServing(daemon);
  }

  /**
   * Issue 32, item 6: a peer that says hello and then never answers. The daemon gives it up
   * after its bound (10 s), reopens the gate with a WARN, and tells the peer before it closes.
   */
  @Test
  void silentSuccessor_isGivenUp_theGateReopens() throws Exception {
    DaemonProcess daemon = start();
    try (TakeOverPeer peer = TakeOverPeer.connect(takeOverSocket())) {
      peer.send(TakeOverFrame.newBuilder().setHello(TakeOverPeer.hostHello()).build());
      // Silent: reads what comes, answers nothing. The old daemon waited 120 s for an answer.
      CompletableFuture<List<TakeOverFrame>> heard = CompletableFuture.supplyAsync(() -> {
        List<TakeOverFrame> frames = new ArrayList<>();
        try {
          for (TakeOverFrame f = peer.receive(); f != null; f = peer.receive()) {
            frames.add(f);
          }
        } catch (IOException e) {
          throw new java.io.UncheckedIOException(e);
        }
        return frames;
      });
      List<TakeOverFrame> frames = heard.get(60, TimeUnit.SECONDS);
      assertTrue(frames.stream().anyMatch(TakeOverFrame::hasState), frames.toString());
      TakeOverFrame last = frames.get(frames.size() - 1);
      assertTrue(last.hasRefusal() && last.getRefusal().getReason().contains("gave the take-over up (no answer "
          + "within 10000 ms of the state)"), frames.toString());
    }
    assertTrue(daemon.awaitLine("given up: no answer within 10000 ms of the state; the gate is open again", 10_000),
        daemon.output());
    assertServing(daemon);
  }

  /**
   * Issue 34, item 6: a successor that takes the segments ahead of the state is sent them while
   * the daemon serves on (a lease is answered while it holds them unanswered), and one that then
   * cannot adopt them (Abort) leaves the daemon serving, its gate never closed, the bytes intact.
   */
  @Test
  void successorAbortingOnTheSegmentsSentAhead_leavesTheDaemonServing_whichServedMeanwhile() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget());
        TakeOverPeer peer = TakeOverPeer.connect(takeOverSocket())) {
      Lease lease = client.lease(0, 1 << 20);
      lease.buffer().put(0, (byte) 0x5a);
      peer.send(TakeOverFrame.newBuilder().setHello(TakeOverPeer.hostHello().toBuilder().setTakesSegmentsAhead(true))
          .build());
      TakeOverFrame frame = nextBesidesDescriptors(peer);
      assertTrue(frame.hasSegmentsAhead() && frame.getSegmentsAhead().getSegmentsCount() >= 1, String.valueOf(frame));

      client.lease(0, 4096).close(); // served: the gate is open while the segments are out

      peer.send(TakeOverFrame.newBuilder().setAbort(Abort.newBuilder().setReason("the test cannot adopt them"))
          .build());
      assertTrue(daemon.awaitLine("could not adopt the segments sent ahead (the test cannot adopt them); serving on",
          30_000), daemon.output());
      assertFalse(daemon.output().contains("no longer applying requests"), daemon.output());
      assertServing(daemon);
      assertEquals((byte) 0x5a, lease.buffer().get(0));
      lease.close();
    }
  }

  /**
   * Issue 34, item 6: a successor that takes the books ahead is sent them (with the lease held
   * before) while the daemon serves on (a lease is answered while it holds them unanswered);
   * inside the pause it is sent only what changed since (that lease, not the one held before); and
   * its Abort then leaves the daemon serving, the bytes intact.
   */
  @Test
  void successorTakingTheBooksAhead_isSentThemWhileTheDaemonServes_thenOnlyTheChanges() throws Exception {
    DaemonProcess daemon = start();
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget());
        TakeOverPeer peer = TakeOverPeer.connect(takeOverSocket())) {
      Lease before = client.lease(0, 1 << 20);
      before.buffer().put(0, (byte) 0x5a);
      peer.send(TakeOverFrame.newBuilder().setHello(TakeOverPeer.hostHello().toBuilder().setTakesSegmentsAhead(true)
          .setTakesStateAhead(true)).build());
      assertTrue(nextBesidesDescriptors(peer).hasSegmentsAhead());
      peer.send(TakeOverFrame.newBuilder().setReady(Ready.getDefaultInstance()).build());
      TakeOverFrame ahead = nextBesidesDescriptors(peer);
      assertTrue(ahead.hasStateAhead() && !ahead.getStateAhead().getChangesOnly(), String.valueOf(ahead.getFrameCase()));
      assertTrue(leaseIds(ahead.getStateAhead()).contains(before.id()), "the books ahead hold the lease held before");

      Lease meanwhile = client.lease(0, 4096); // served: the gate is open while the books are out
      peer.send(TakeOverFrame.newBuilder().setReady(Ready.getDefaultInstance()).build());
      TakeOverFrame state = nextBesidesDescriptors(peer);

      assertTrue(state.hasState() && state.getState().getChangesOnly(), String.valueOf(state.getFrameCase()));
      assertEquals(List.of(meanwhile.id()), leaseIds(state.getState()), "only the lease made since is carried");
      assertEquals(ahead.getStateAhead().getSessions().getSessionsCount(),
          state.getState().getSessions().getSessionsCount(), "sessions are carried whole");
      assertTrue(state.getState().getPools(0).getSegmentIdsCount() >= 1, "every segment id is listed");
      peer.send(TakeOverFrame.newBuilder().setAbort(Abort.newBuilder().setReason("the test stops here")).build());
      assertTrue(daemon.awaitLine("could not restore the state (the test stops here); serving on", 30_000),
          daemon.output());
      assertServing(daemon);
      assertEquals((byte) 0x5a, before.buffer().get(0));
      meanwhile.close();
      before.close();
    }
  }

  private static TakeOverFrame nextBesidesDescriptors(TakeOverPeer peer) throws IOException {
    TakeOverFrame frame = peer.receive();
    while (frame != null && frame.hasDescriptors()) {
      frame = peer.receive();
    }
    assertTrue(frame != null, "the daemon closed the take-over connection");
    return frame;
  }

  private static List<String> leaseIds(State state) {
    return state.getSessions().getLeasesList().stream().map(LeaseState::getId).toList();
  }

  /**
   * Issue 34, item 6: at a successor's Hello the daemon tells every attached session where the
   * successor listens until it serves (a SuccessorNotice with the Hello's {@code serving_at}), so
   * that its clients connect there before the pause; a name that is not a plain file name is not
   * passed on. Both successors here abort, and the daemon serves on; the one it named is then
   * named gone (an empty name), so that clients drop the connection they made to it.
   */
  @Test
  void successorsHello_tellsAttachedSessionsWhereItListens_notANameWithASlash_andThatItWentAway() throws Exception {
    DaemonProcess daemon = start();
    try (TestChannel grpc = new TestChannel(daemon.unixTarget())) {
      String session = AllocatorGrpc.newBlockingStub(grpc.channel())
          .openSession(OpenSessionRequest.newBuilder().setClientName("told").build()).getSessionId();
      BlockingQueue<SessionEvent> events = new LinkedBlockingQueue<>();
      StreamObserver<KeepAliveRequest> requests = EventStream.attach(grpc.channel(), session, events);
      SessionEvent attached = events.poll(10, TimeUnit.SECONDS);
      assertTrue(attached != null && attached.hasAttached(), String.valueOf(attached));

      List<String> names = List.of("../gpumemd.sock.new-1", "gpumemd.sock.new-4242");
      for (int i = 0; i < names.size(); i++) {
        try (TakeOverPeer peer = TakeOverPeer.connect(takeOverSocket())) {
          peer.send(TakeOverFrame.newBuilder().setHello(TakeOverPeer.hostHello().toBuilder()
              .setTakesSegmentsAhead(true).setServingAt(names.get(i))).build());
          TakeOverFrame frame = peer.receive();
          while (frame != null && frame.hasDescriptors()) {
            frame = peer.receive();
          }
          assertTrue(frame != null && frame.hasSegmentsAhead(), String.valueOf(frame));
          peer.send(TakeOverFrame.newBuilder().setAbort(Abort.newBuilder().setReason("a test")).build());
          int served = i + 1;
          assertTrue(awaitCount(daemon, "could not adopt the segments sent ahead (a test); serving on", served),
              daemon.output());
        }
      }
      SessionEvent told = events.poll(10, TimeUnit.SECONDS);
      assertTrue(told != null && told.hasSuccessor(), String.valueOf(told));
      assertEquals("gpumemd.sock.new-4242", told.getSuccessor().getSocketName());
      // That successor's hand-over was given up: the clients hear it went away (an empty name).
      SessionEvent gone = events.poll(10, TimeUnit.SECONDS);
      assertTrue(gone != null && gone.hasSuccessor(), String.valueOf(gone));
      assertEquals("", gone.getSuccessor().getSocketName());
      assertEquals(null, events.poll(300, TimeUnit.MILLISECONDS), "a third notice");
      requests.onCompleted();
    }
    assertServing(daemon);
  }

  /** Waits until {@code line} is in the daemon's output {@code count} times; false after 30 s. */
  private static boolean awaitCount(DaemonProcess daemon, String line, int count) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (daemon.output().split(java.util.regex.Pattern.quote(line), -1).length - 1 < count) {
      if (System.nanoTime() > deadline) {
        return false;
      }
      Thread.sleep(20);
    }
    return true;
  }

  /**
   * Issue 32, item 8: a start SIGKILLed between binding and publishing leaves {@code *.new-PID}
   * sockets. The next start removes those of dead pids (INFO) and leaves a live pid's alone.
   */
  @Test
  void staleTemporarySocketsOfDeadPids_areRemovedAtStart_liveOnesKept() throws Exception {
    Process gone = new ProcessBuilder("true").start();
    assertEquals(0, gone.waitFor());
    long dead = gone.pid();
    long live = ProcessHandle.current().pid();
    Path deadSocket = socketFile(dir.resolve("gpumemd.sock.new-" + dead));
    Path deadTakeOver = socketFile(dir.resolve("gpumemd.sock.takeover.new-" + dead));
    Path liveSocket = socketFile(dir.resolve("gpumemd.sock.new-" + live));

    DaemonProcess daemon = start();

    assertFalse(Files.exists(deadSocket), deadSocket + " is still there");
    assertFalse(Files.exists(deadTakeOver), deadTakeOver + " is still there");
    assertTrue(Files.exists(liveSocket), "a live process's " + liveSocket + " was removed");
    assertTrue(daemon.output().contains("Removed " + deadSocket + ": a temporary socket of pid " + dead
        + ", which no longer runs"), daemon.output());
    assertTrue(daemon.output().contains("Removed " + deadTakeOver), daemon.output());
    assertServing(daemon);
  }

  /** A socket file left at {@code path}, as a killed process leaves it. */
  private static Path socketFile(Path path) throws IOException {
    try (ServerSocketChannel s = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
      s.bind(UnixDomainSocketAddress.of(path));
    }
    assertTrue(Files.exists(path));
    return path;
  }

  private static void assertServing(DaemonProcess daemon) throws Exception {
    assertTrue(daemon.process().isAlive(), daemon.output());
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      client.lease(0, 4096).close();
    }
  }
}
