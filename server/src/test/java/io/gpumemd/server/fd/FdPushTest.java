package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.pool.DescriptorHolder;
import io.gpumemd.server.testing.Await;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestChannel;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * Pushed descriptors (FdRequest.bind) against a real daemon with {@code --host-segments fd}: a
 * bound connection holds each new segment's descriptor when the Lease reply comes, once per
 * segment; a peer that never reads is pushed a few, not one per lease; and a process of another
 * uid ({@link FdPushPeerMain} via {@code setpriv}) cannot bind another tenant's session, is
 * pushed only its own session's segments, and becomes a holder of what it was pushed.
 *
 * <p>Leases go through the gRPC socket (the push is made before the Lease reply), as this JVM:
 * its uid is the tenant of {@link #me}'s sessions.
 */
class FdPushTest {
  private static final long MIB = 1L << 20;

  private final Caller me = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid(), 0,
      (int) ProcessHandle.current().pid());
  private TestDaemon daemon;
  private TestChannel grpc;
  private Process peer;

  @AfterEach
  void stop() throws Exception {
    if (peer != null) {
      peer.destroyForcibly();
      peer.waitFor(10, TimeUnit.SECONDS);
    }
    if (grpc != null) {
      grpc.close();
    }
    if (daemon != null) {
      daemon.close();
    }
  }

  private AllocatorGrpc.AllocatorBlockingStub start(String... flags) {
    List<String> all = new ArrayList<>(List.of("--host-segments", "fd"));
    all.addAll(List.of(flags));
    daemon = TestDaemon.start(all.toArray(String[]::new));
    grpc = new TestChannel(daemon.unixTarget());
    return AllocatorGrpc.newBlockingStub(grpc.channel());
  }

  private static LeaseResponse lease(AllocatorGrpc.AllocatorBlockingStub stub, String session, long bytes) {
    return stub.lease(LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(bytes).build());
  }

  private static FdTestClient.Reply bind(FdTestClient client, long id, String session) throws Exception {
    client.send(FdRequest.newBuilder().setRequestId(id).setSessionId(session).setBind(true).build());
    return client.receive();
  }

  @Test
  void aBoundConnection_holdsEachNewSegmentsDescriptorWhenTheLeaseReplyComes_once() throws Exception {
    AllocatorGrpc.AllocatorBlockingStub stub = start();
    String session = daemon.server().registry().open(me, "push", 0, -1).id();
    try (FdTestClient client = new FdTestClient(daemon.server().fdSocketPath());
        LogCapture log = LogCapture.withDebug(FdChannel.class)) {
      assertEquals(FdReply.ResultCase.BOUND, bind(client, 7, session).reply().getResultCase());
      assertEquals(List.of(), log.messages("WARN"), "a bind is no refusal");
      assertTrue(log.messages("DEBUG").stream().noneMatch(m -> m.contains("refused")), "a bind is no refusal: "
          + log.messages("DEBUG"));
      List<LeaseResponse> leases = new ArrayList<>();
      for (int i = 0; i < 3; i++) {
        LeaseResponse lease = lease(stub, session, 2 * MIB);
        leases.add(lease);
        assertTrue(client.readable() > 0, "the push is in the socket when the reply comes, nothing to wait for");
        FdTestClient.Reply pushed = client.receive();
        try {
          assertTrue(pushed.reply().getPushed(), pushed.reply().toString());
          assertEquals(7, pushed.reply().getRequestId(), "a push carries the request id of its session's bind");
          assertEquals(lease.getHandle().getSegmentId(), pushed.reply().getGranted().getSegmentId());
          assertEquals(lease.getHandle().getSegmentBytes(), pushed.reply().getGranted().getSegmentBytes());
          assertTrue(pushed.fd() > 0, "with its descriptor");
        } finally {
          FdTestClient.closeQuietly(pushed.fd());
        }
      }
      assertEquals(3, leases.stream().map(l -> l.getHandle().getSegmentId()).distinct().count());

      // the first segment again (the only one free): sent already, not pushed again
      stub.release(ReleaseRequest.newBuilder().setSessionId(session).setLeaseId(leases.get(0).getLeaseId()).build());
      LeaseResponse again = lease(stub, session, 2 * MIB);
      assertEquals(leases.get(0).getHandle().getSegmentId(), again.getHandle().getSegmentId());
      assertEquals(0, client.readable(), "nothing pushed for a segment the connection was sent");

      // a fetch on the bound connection is answered as ever, in order
      client.send(FdRequest.newBuilder().setRequestId(8).setSessionId(session)
          .setSegmentId(again.getHandle().getSegmentId()).build());
      FdTestClient.Reply fetched = client.receive();
      FdTestClient.closeQuietly(fetched.fd());
      assertEquals(8, fetched.reply().getRequestId());
      assertEquals(FdReply.ResultCase.GRANTED, fetched.reply().getResultCase());
      // The sender closes a descriptor after its reply is sent: the client may read the reply first.
      Await.until(() -> daemon.server().fdChannel().inFlight() == 0, "every pushed descriptor sent and closed");
    }
  }

  @Test
  void aPeerThatNeverReadsItsPushes_isPushedAFew_notOnePerLease_andLeasesGoOn() throws Exception {
    AllocatorGrpc.AllocatorBlockingStub stub = start();
    String session = daemon.server().registry().open(me, "push", 0, -1).id();
    int leases = 40;
    try (FdTestClient client = new FdTestClient(daemon.server().fdSocketPath())) {
      assertEquals(FdReply.ResultCase.BOUND, bind(client, 1, session).reply().getResultCase());
      Set<Long> segments = new HashSet<>();
      for (int i = 0; i < leases; i++) {
        segments.add(lease(stub, session, 2 * MIB).getHandle().getSegmentId()); // none read meanwhile
      }
      assertEquals(leases, segments.size());
      int pushed = 0;
      while (client.readable() > 0) {
        FdTestClient.Reply reply = client.receive();
        FdTestClient.closeQuietly(reply.fd());
        assertTrue(reply.reply().getPushed() && reply.fd() > 0, reply.reply().toString());
        pushed++;
      }
      assertTrue(pushed >= 1 && pushed <= 16, pushed + " pushes waited unread (expected: a few, at most "
          + FdChannel.MAX_UNREAD_FOR_PUSH + " bytes' worth)");
      Await.until(() -> daemon.server().fdChannel().inFlight() == 0, "every pushed descriptor sent and closed");
    }
  }

  @Test
  void aPeerOfAnotherUid_cannotBindAnotherTenantsSession_andIsPushedOnlyItsOwn_asAHolder() throws Exception {
    Assumptions.assumeTrue(OtherUser.available(), "needs root and setpriv to run a peer as uid 65534");
    AllocatorGrpc.AllocatorBlockingStub stub = start("--socket-mode", "0666");
    OtherUser.openUp(daemon.server().fdSocketPath().getParent());
    Caller nobody = IdentityPolicy.defaults().unixPeer(OtherUser.NOBODY, OtherUser.NOBODY, 1);
    String theirs = daemon.server().registry().open(nobody, "theirs", 0, -1).id();
    String mine = daemon.server().registry().open(me, "mine", 0, -1).id();
    List<String> command = OtherUser.javaCommand(OtherUser.NOBODY, OtherUser.NOBODY, List.of(),
        FdPushPeerMain.class.getName());
    command.addAll(List.of(daemon.server().fdSocketPath().toString(), theirs, mine));
    peer = new ProcessBuilder(command).redirectErrorStream(true).start();
    BufferedReader out = new BufferedReader(new InputStreamReader(peer.getInputStream(), StandardCharsets.UTF_8));
    assertEquals("BOUND own=BOUND other=REFUSED:5", line(out, "BOUND"), "another tenant's session: NOT_FOUND");

    long mySegment = lease(stub, mine, 2 * MIB).getHandle().getSegmentId(); // no push can reach the peer
    LeaseRecord their = daemon.server().registry().lease(nobody, theirs, 0, 2 * MIB, false, "", false);
    long theirSegment = their.block().segmentId();
    assertNotEquals(mySegment, theirSegment, "tenants never share segments");
    // the hook the Allocator service calls before a Lease reply of their session
    daemon.server().fdChannel().pushes().beforeLeaseReply(theirs, theirSegment);

    Writer in = new OutputStreamWriter(peer.getOutputStream(), StandardCharsets.UTF_8);
    in.write("check\n");
    in.flush();
    assertEquals("PUSHED 1 segments=" + theirSegment, line(out, "PUSHED"));
    long peerPid = peer.pid();
    assertTrue(daemon.server().registry().pools().descriptorHolders().stream().map(DescriptorHolder::parse)
        .anyMatch(h -> h.pid() == peerPid && h.session().equals(theirs)),
        "a pushed descriptor makes its process a holder, as a fetched one does");
  }

  private static String line(BufferedReader out, String prefix) throws Exception {
    StringBuilder seen = new StringBuilder();
    for (String line; (line = out.readLine()) != null; ) {
      if (line.startsWith(prefix)) {
        return line;
      }
      seen.append(line).append('\n');
    }
    throw new AssertionError("the peer printed no " + prefix + " line:\n" + seen);
  }
}
