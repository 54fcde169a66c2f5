package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.testing.Await;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * One tenant cannot fill the fd channel for another: tenant A is a real process under uid 65534
 * ({@link FdTenantPeerMain} via {@code setpriv}), tenant B this JVM (root), both on a real
 * daemon's fd socket. A at its connection bound with idle and half-frame connections leaves B
 * room to connect and fetch; A's connections that never read hold no more than A's share of the
 * places in flight, B fetching meanwhile, and give them back at the stall deadline (they stay
 * open and counted while their unread replies hold descriptors in flight, until the process
 * goes); idle and half-frame connections are closed at their deadlines. Waits are bounded polls
 * ({@link Await}); deadlines are small flags.
 */
class FdFairnessTest {
  private static final int NOBODY = OtherUser.NOBODY;
  private static final String A = "uid:" + NOBODY;

  private final Caller b = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid(), 0,
      (int) ProcessHandle.current().pid());
  private TestDaemon daemon;
  private Process peer;
  private final BlockingQueue<String> peerLines = new LinkedBlockingQueue<>();
  private final List<String> peerOutput = new ArrayList<>();

  @BeforeEach
  void needRoot() {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run tenant A as uid 65534");
  }

  @AfterEach
  void stop() throws Exception {
    if (peer != null) {
      peer.destroyForcibly();
      peer.waitFor(10, TimeUnit.SECONDS);
    }
    if (daemon != null) {
      daemon.close();
    }
  }

  private FdChannel start(String... flags) {
    List<String> all = new ArrayList<>(List.of("--host-segments", "fd", "--socket-mode", "0666"));
    all.addAll(List.of(flags));
    daemon = TestDaemon.start(all.toArray(String[]::new));
    OtherUser.openUp(daemon.server().fdSocketPath().getParent());
    return daemon.server().fdChannel();
  }

  /** A session of {@code caller}'s tenant and the segment of a lease it holds. */
  private String[] sessionAndSegment(Caller caller) {
    String session = daemon.server().registry().open(caller, "fair", 0, -1).id();
    LeaseRecord lease = daemon.server().registry().lease(caller, session, 0, 64 << 10, false, "", false);
    return new String[] {session, Long.toString(lease.block().segmentId())};
  }

  /** Starts tenant A's process with connections of these kinds and waits until it holds them. */
  private void startTenantA(String... kinds) throws Exception {
    Caller a = IdentityPolicy.defaults().unixPeer(NOBODY, NOBODY, 1);
    String[] held = sessionAndSegment(a);
    List<String> command = OtherUser.javaCommand(NOBODY, NOBODY, List.of(), FdTenantPeerMain.class.getName());
    command.add(daemon.server().fdSocketPath().toString());
    command.add(held[0]);
    command.add(held[1]);
    command.addAll(List.of(kinds));
    peer = new ProcessBuilder(command).redirectErrorStream(true).start();
    Thread pump = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(peer.getInputStream(), StandardCharsets.UTF_8))) {
        for (String line; (line = in.readLine()) != null; ) {
          synchronized (peerOutput) {
            peerOutput.add(line);
          }
          peerLines.add(line);
        }
      } catch (Exception e) {
        // the process ended
      }
    }, "tenant-a-output");
    pump.setDaemon(true);
    pump.start();
    assertTrue(nextLine("READY").startsWith("READY"));
  }

  private String nextLine(String prefix) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    while (System.nanoTime() < deadline) {
      String line = peerLines.poll(100, TimeUnit.MILLISECONDS);
      if (line != null && line.startsWith(prefix)) {
        return line;
      }
    }
    synchronized (peerOutput) {
      throw new AssertionError("tenant A printed no " + prefix + " line within 60 s:\n" + String.join("\n", peerOutput));
    }
  }

  private void tellTenantA(String line) throws Exception {
    Writer in = new OutputStreamWriter(peer.getOutputStream(), StandardCharsets.UTF_8);
    in.write(line + "\n");
    in.flush();
  }

  /** B fetches its segment's descriptor on a connection of its own: granted, with a descriptor. */
  private static void fetches(FdTestClient client, String[] held, long id) throws Exception {
    client.send(FdRequest.newBuilder().setRequestId(id).setSessionId(held[0]).setSegmentId(Long.parseLong(held[1]))
        .build());
    FdTestClient.Reply reply = client.receive();
    assertNotNull(reply, "tenant B's connection was closed instead of answered");
    FdTestClient.closeQuietly(reply.fd());
    assertEquals(FdReply.ResultCase.GRANTED, reply.reply().getResultCase(), reply.reply().toString());
    assertTrue(reply.fd() > 0);
  }

  @Test
  void tenantAtItsConnectionBound_withIdleAndHalfFrameConnections_leavesAnotherTenantRoom() throws Exception {
    // Nine in all: A's eight attempts would leave B one connection without A's own bound.
    FdChannel channel = start("--fd-max-connections", "9", "--fd-max-connections-per-tenant", "4",
        "--fd-first-request-timeout-ms", "600000");
    String[] mine = sessionAndSegment(b);
    try (LogCapture log = new LogCapture(FdChannel.class)) {
      startTenantA("idle=4", "half=4");
      Await.until(() -> channel.liveConnections(A) == 4 && channel.liveConnections() == 4,
          "tenant A held to 4 of its 8 connections, the only ones live");

      List<FdTestClient> bs = new ArrayList<>();
      try {
        for (int i = 0; i < 4; i++) {
          FdTestClient client = new FdTestClient(daemon.server().fdSocketPath());
          bs.add(client);
          fetches(client, mine, i + 1);
        }
        try (FdTestClient fifth = new FdTestClient(daemon.server().fdSocketPath())) {
          assertTrue(fifth.closedByDaemon(), "tenant B is held to its own bound too");
        }
      } finally {
        for (FdTestClient client : bs) {
          client.close();
        }
      }
      assertTrue(log.messages("WARN").stream().anyMatch(m -> m.contains("its limit (flag "
          + "--fd-max-connections-per-tenant)") && m.contains("tenant " + A)), log.messages("WARN").toString());
    }
  }

  @Test
  void idleAndHalfFrameConnections_areClosedAtTheirDeadlines() throws Exception {
    FdChannel channel = start("--fd-first-request-timeout-ms", "1000", "--fd-idle-timeout-seconds", "1");
    try (LogCapture log = new LogCapture(FdChannel.class)) {
      startTenantA("idle=2", "half=2", "idleAfterOne=2", "halfAfterOne=2");
      tellTenantA("check");
      assertEquals("RESULT closed=8 of=8", nextLine("RESULT"));
      Await.until(() -> channel.liveConnections(A) == 0 && channel.liveConnections() == 0,
          "tenant A's connections gone from the counts");
      assertTrue(log.messages("WARN").stream().anyMatch(m -> m.contains("closed") && m.contains(A.replace(":", " "))
          && m.contains("(flag --fd-first-request-timeout-ms)")), log.messages("WARN").toString());
    }
  }

  @Test
  void connectionsThatNeverRead_holdTheirTenantsShareOfPlacesInFlight_untilTheStallDeadline_andStayCounted()
      throws Exception {
    FdChannel channel = start("--fd-max-in-flight", "24", "--fd-max-in-flight-per-tenant", "8",
        "--fd-stall-timeout-ms", "5000");
    String[] mine = sessionAndSegment(b);
    try (LogCapture log = new LogCapture(FdChannel.class)) {
      // Three connections that could hold 16 unsent descriptors each: 48, twice the channel's 24.
      startTenantA("flood=3");
      Await.until(() -> channel.inFlight(A) == 8, "tenant A holding its 8 places in flight, no more");

      try (FdTestClient client = new FdTestClient(daemon.server().fdSocketPath())) {
        fetches(client, mine, 1);
        fetches(client, mine, 2);
      }
      assertTrue(log.messages("WARN").stream().anyMatch(m -> m.contains("(flag --fd-max-in-flight-per-tenant)")),
          log.messages("WARN").toString());

      Await.until(() -> channel.inFlight() == 0, "tenant A's places in flight given back at the stall deadline");
      assertTrue(log.messages("WARN").stream().anyMatch(m -> m.contains("unread for 5000 ms (flag "
          + "--fd-stall-timeout-ms)")), log.messages("WARN").toString());
      // The replies the kernel holds for it unread carry descriptors charged to the daemon's
      // user: its connections stay open, and counted, until its process reads or closes them.
      assertEquals(3, channel.liveConnections(A));
      peer.destroyForcibly();
      assertTrue(peer.waitFor(10, TimeUnit.SECONDS));
      Await.until(() -> channel.liveConnections(A) == 0 && channel.liveConnections() == 0,
          "tenant A's connections closed once its process closed its sockets");
    }
  }
}
