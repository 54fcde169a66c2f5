package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.config.FdChannelConfig;
import io.gpumemd.server.fd.DescriptorPins;
import io.gpumemd.server.fd.DescriptorPushes;
import io.gpumemd.server.fd.FdChannel;
import io.gpumemd.server.fd.FdGrants;
import io.gpumemd.server.fd.FdTestClient;
import io.gpumemd.server.testing.TestDaemon;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * An fd-channel fetch while a hand-over has the gate closed makes no holder in books that are
 * being written down for the successor: it waits, unanswered, for the hand-over's end. Answered
 * (granted) when the gate opens again; when the successor serves instead, the connection is
 * closed without an answer, so the client fetches again from the successor; a fetch that comes
 * after that is closed the same way. A real {@link FdChannel} on a real socket, a real daemon's
 * books on memfd segments, and the real {@link HandOverGate} that {@link HandOverAttempt} drives.
 * The stall deadline (100 ms here) does not close a connection whose fetch waits for the gate.
 */
class FdFetchDuringHandOverTest {
  /** Longer than the stall deadline below, and far longer than an open gate takes to answer. */
  private static final long HELD_MILLIS = 400;

  @TempDir
  Path dir;

  private TestDaemon daemon;
  private final HandOverGate gate = new HandOverGate();
  private FdChannel channel;
  private Path socket;
  private String session;
  private long segment;

  @BeforeEach
  void start() throws Exception {
    daemon = TestDaemon.start("--host-segments", "fd");
    Caller me = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid(), 0, (int) ProcessHandle.current().pid());
    session = daemon.server().registry().open(me, "handover", 0, -1).id();
    segment = daemon.server().registry().lease(me, session, 0, 4096, false, "", false).block().segmentId();
    FdChannelConfig defaults = FdChannelConfig.defaults(null);
    Ticker ticker = Ticker.system();
    channel = new FdChannel(IdentityPolicy.defaults(),
        new FdGrants(daemon.server().registry(), new DescriptorPins(daemon.server().pools(), ticker)),
        new DescriptorPushes(), gate, new FdChannelConfig(null, 0, 0, defaults.maxInFlight(),
            defaults.maxInFlightPerTenant(), defaults.firstRequestMillis(), defaults.idleSeconds(), 100), ticker);
    socket = dir.resolve("fd.sock");
    channel.bind(socket);
  }

  @AfterEach
  void stop() {
    channel.close();
    daemon.close();
  }

  private FdRequest fetch(long id) {
    return FdRequest.newBuilder().setRequestId(id).setSessionId(session).setSegmentId(segment).build();
  }

  @Test
  void fetchWhileHandingOver_waitsUnanswered_andIsGrantedWhenTheGateOpensAgain() throws Exception {
    try (FdTestClient client = new FdTestClient(socket)) {
      client.send(fetch(1));
      FdTestClient.Reply before = client.receive();
      assertEquals(FdReply.ResultCase.GRANTED, before.reply().getResultCase());
      FdTestClient.closeQuietly(before.fd());

      assertEquals(0, gate.closeForHandOver(1_000));
      client.send(fetch(2));
      client.send(fetch(3)); // behind it, in order
      Thread.sleep(HELD_MILLIS);
      assertEquals(0, client.readable(), "answered while the gate was closed for a hand-over");

      gate.open(); // the hand-over did not happen
      for (long id = 2; id <= 3; id++) {
        FdTestClient.Reply reply = client.receive();
        assertEquals(id, reply.reply().getRequestId());
        assertEquals(FdReply.ResultCase.GRANTED, reply.reply().getResultCase(), reply.reply().toString());
        assertTrue(reply.fd() > 0);
        assertTrue(Files.exists(Path.of("/proc/self/fd/" + reply.fd())));
        FdTestClient.closeQuietly(reply.fd());
      }
    }
  }

  @Test
  void fetchWhileHandingOver_isClosedUnansweredOnceTheSuccessorServes_asIsOneAfterIt() throws Exception {
    try (FdTestClient held = new FdTestClient(socket)) {
      assertEquals(0, gate.closeForHandOver(1_000));
      held.send(fetch(1));
      Thread.sleep(HELD_MILLIS);
      assertEquals(0, held.readable(), "answered while the gate was closed for a hand-over");

      gate.moved(); // the successor serves; the gate stays closed here
      assertTrue(held.closedByDaemon(), "the held fetch's connection stays open after the move");
    }
    try (FdTestClient late = new FdTestClient(socket)) {
      late.send(fetch(2));
      assertTrue(late.closedByDaemon(), "a fetch after the move was answered by the daemon that handed over");
    }
  }
}
