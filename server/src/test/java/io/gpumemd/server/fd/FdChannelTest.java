package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The fd channel against a real daemon on the host backend with {@code --host-segments fd}, over
 * its real socket, spoken by {@link FdTestClient}: what a peer of the session's tenant gets (a
 * descriptor of the very segment, read-only where it must be), what everyone else gets (a
 * refusal with a reason and no descriptor, the connection still usable), malformed frames, and
 * the bounds on connections and requests, each refusal logged at most once a minute.
 *
 * <p>This JVM is the peer: its uid is the tenant of the sessions it opens through the registry
 * ({@code uid:N}); "another tenant" is a session opened for uid 1000.
 */
class FdChannelTest {
  private static final long MIB = 1L << 20;
  private static final String UNKNOWN_SESSION = "0123456789abcdef0123456789abcdef";

  private TestDaemon daemon;
  private final Caller me = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid(), 0,
      (int) ProcessHandle.current().pid());
  private final Caller other = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid() + 1000, 4242, 1);

  @AfterEach
  void stop() {
    if (daemon != null) {
      daemon.close();
    }
  }

  private TestDaemon start(String... flags) {
    daemon = TestDaemon.start(withFd(flags));
    return daemon;
  }

  private static String[] withFd(String... flags) {
    String[] all = new String[flags.length + 2];
    all[0] = "--host-segments";
    all[1] = "fd";
    System.arraycopy(flags, 0, all, 2, flags.length);
    return all;
  }

  private SessionRegistry registry() {
    return daemon.server().registry();
  }

  private String openSession(Caller caller) {
    return registry().open(caller, "fd-test", 0, -1).id();
  }

  private LeaseRecord lease(Caller caller, String session, long bytes) {
    return registry().lease(caller, session, 0, bytes, false, "", false);
  }

  private FdTestClient client() throws Exception {
    return new FdTestClient(daemon.server().fdSocketPath());
  }

  private static FdRequest request(long id, String session, long segment, boolean readOnly) {
    return FdRequest.newBuilder().setRequestId(id).setSessionId(session).setSegmentId(segment)
        .setReadOnly(readOnly).build();
  }

  private static FdTestClient.Reply ask(FdTestClient client, FdRequest request) throws Exception {
    client.send(request);
    FdTestClient.Reply reply = client.receive();
    assertNotNull(reply, "the daemon closed the connection instead of answering " + request);
    assertEquals(request.getRequestId(), reply.reply().getRequestId());
    return reply;
  }

  /** The O_ACCMODE bits of one of this process's descriptors. */
  private static int accessMode(int fd) throws Exception {
    for (String line : Files.readAllLines(Path.of("/proc/self/fdinfo/" + fd))) {
      if (line.startsWith("flags:")) {
        return Integer.parseInt(line.substring(6).trim(), 8) & 3;
      }
    }
    throw new AssertionError("no flags for fd " + fd);
  }

  private static void assertRefused(FdTestClient.Reply reply, Status.Code code, String inMessage) {
    assertEquals(FdReply.ResultCase.REFUSED, reply.reply().getResultCase(), reply.reply().toString());
    assertEquals(-1, reply.fd(), "a refusal carries no descriptor");
    assertEquals(code.value(), reply.reply().getRefused().getCode(), reply.reply().getRefused().getMessage());
    assertTrue(reply.reply().getRefused().getMessage().contains(inMessage), reply.reply().getRefused().getMessage());
  }

  // ------------------------------------------------------------------------------- granted

  @Test
  void leaseOfOwnSession_getsADescriptorOfTheVerySegment() throws Exception {
    start();
    String session = openSession(me);
    LeaseRecord lease = lease(me, session, 64 << 10);
    long segment = lease.block().segmentId();

    try (FdTestClient client = client()) {
      FdTestClient.Reply first = ask(client, request(1, session, segment, false));
      FdTestClient.Reply second = ask(client, request(2, session, segment, false));
      try {
        assertEquals(FdReply.ResultCase.GRANTED, first.reply().getResultCase(), first.reply().toString());
        assertEquals(segment, first.reply().getGranted().getSegmentId());
        assertEquals(lease.block().segmentBytes(), first.reply().getGranted().getSegmentBytes());
        assertFalse(first.reply().getGranted().getReadOnly());
        assertEquals(2, accessMode(first.fd()), "O_RDWR");
        byte[] pattern = {9, 8, 7, 6, 5};
        long offset = lease.block().offset() + 100;
        map(first.fd(), lease.block().segmentBytes()).put((int) offset, pattern);

        byte[] seen = new byte[pattern.length];
        map(second.fd(), lease.block().segmentBytes()).get((int) offset, seen);
        assertArrayEquals(pattern, seen, "two descriptors of one segment: the same bytes");
        daemon.server().backend().zero(lease.block().memory(), offset, pattern.length);
        map(second.fd(), lease.block().segmentBytes()).get((int) offset, seen);
        assertArrayEquals(new byte[pattern.length], seen, "the daemon's zero reaches the descriptor's memory");
      } finally {
        FdTestClient.closeQuietly(first.fd());
        FdTestClient.closeQuietly(second.fd());
      }
    }
  }

  private static MappedByteBuffer map(int fd, long bytes) throws Exception {
    try (FileChannel channel = FileChannel.open(Path.of("/proc/self/fd/" + fd), StandardOpenOption.READ,
        StandardOpenOption.WRITE)) {
      return channel.map(FileChannel.MapMode.READ_WRITE, 0, bytes);
    }
  }

  @Test
  void readOnlyRequest_andReadOnlyHold_getReadOnlyDescriptors() throws Exception {
    start();
    String owner = openSession(me);
    LeaseRecord lease = lease(me, owner, 64 << 10);
    String holder = openSession(me);
    String token = registry().sharing().share(me, owner, lease.id(), 0, true, 0).token();
    registry().sharing().attach(me, holder, token, "");
    long segment = lease.block().segmentId();

    try (FdTestClient client = client()) {
      FdTestClient.Reply asked = ask(client, request(1, owner, segment, true));
      FdTestClient.Reply hold = ask(client, request(2, holder, segment, false));
      try {
        assertTrue(asked.reply().getGranted().getReadOnly());
        assertEquals(0, accessMode(asked.fd()), "O_RDONLY as asked");
        assertTrue(hold.reply().getGranted().getReadOnly(), "a read-only hold gets read-only, even asking writable");
        assertEquals(0, accessMode(hold.fd()), "O_RDONLY");
      } finally {
        FdTestClient.closeQuietly(asked.fd());
        FdTestClient.closeQuietly(hold.fd());
      }
    }
  }

  // ------------------------------------------------------------------------------- refused

  @Test
  void everyoneElse_isRefusedWithAReason_noDescriptor_andTheConnectionStaysUsable() throws Exception {
    start();
    String mine = openSession(me);
    LeaseRecord lease = lease(me, mine, 64 << 10);
    String idle = openSession(me);
    String theirs = openSession(other);
    LeaseRecord theirLease = lease(other, theirs, 4 * MIB); // a segment of their own
    LeaseRecord released = lease(me, mine, 4 * MIB);
    registry().release(me, mine, released.id(), new byte[0]);

    try (FdTestClient client = client()) {
      FdTestClient.Reply unknown = ask(client, request(1, UNKNOWN_SESSION, lease.block().segmentId(), false));
      assertRefused(unknown, Status.Code.NOT_FOUND, "session " + UNKNOWN_SESSION + " not found");
      FdTestClient.Reply foreign = ask(client, request(2, theirs, theirLease.block().segmentId(), false));
      assertRefused(foreign, Status.Code.NOT_FOUND, "session " + theirs + " not found");
      assertEquals(unknown.reply().getRefused().getMessage().replace(UNKNOWN_SESSION, theirs),
          foreign.reply().getRefused().getMessage(), "another tenant's session answers like an unknown one");
      assertRefused(ask(client, request(3, mine, theirLease.block().segmentId(), false)), Status.Code.NOT_FOUND,
          "holds no lease or hold in it");
      assertRefused(ask(client, request(4, idle, lease.block().segmentId(), false)), Status.Code.NOT_FOUND,
          "holds no lease or hold in it");
      assertRefused(ask(client, request(5, mine, released.block().segmentId(), false)), Status.Code.NOT_FOUND,
          "holds no lease or hold in it");
      assertRefused(ask(client, request(6, "not-an-id", lease.block().segmentId(), false)),
          Status.Code.INVALID_ARGUMENT, "session_id");

      FdTestClient.Reply granted = ask(client, request(7, mine, lease.block().segmentId(), false));
      FdTestClient.closeQuietly(granted.fd());
      assertEquals(FdReply.ResultCase.GRANTED, granted.reply().getResultCase(), "still usable after refusals");
    }
  }

  @Test
  void socket_isBesideTheGrpcSocket_withItsMode_andGoesAtShutdown() throws Exception {
    start("--socket-mode", "0660");
    Path socket = daemon.server().fdSocketPath();
    assertEquals(Path.of(daemon.server().socketPath() + ".fd"), socket);
    assertEquals("rw-rw----", java.nio.file.attribute.PosixFilePermissions.toString(Files.getPosixFilePermissions(socket)));

    daemon.close();
    daemon = null;
    assertFalse(Files.exists(socket));
  }

  @Test
  void pathSegments_haveNoFdChannel() {
    daemon = TestDaemon.start("--host-segments", "path");
    assertNull(daemon.server().fdSocketPath());
    assertFalse(Files.exists(Path.of(daemon.server().socketPath() + ".fd")));
  }

  @Test
  void malformedFrames_areRefused_andTheConnectionClosed() throws Exception {
    start();
    try (FdTestClient tooLong = client(); FdTestClient garbage = client()) {
      tooLong.sendRaw(ByteBuffer.allocate(4).putInt(5000).flip());
      FdTestClient.Reply reply = tooLong.receive();
      assertRefused(reply, Status.Code.INVALID_ARGUMENT, "longer than 4096 bytes");
      assertTrue(tooLong.closedByDaemon());

      garbage.sendRaw(ByteBuffer.allocate(7).putInt(3).put(new byte[] {(byte) 0xff, (byte) 0xff, (byte) 0xff}).flip());
      assertRefused(garbage.receive(), Status.Code.INVALID_ARGUMENT, "not an FdRequest");
      assertTrue(garbage.closedByDaemon());
    }
  }

  // -------------------------------------------------------------------------------- bounds

  @Test
  void connectionsBeyondTheLimit_areClosedAtOnce_andLoggedOnce() throws Exception {
    start("--fd-max-connections", "2");
    String session = openSession(me);
    try (LogCapture log = new LogCapture(FdChannel.class); FdTestClient first = client();
        FdTestClient second = client()) {
      assertRefused(ask(first, request(1, session, 1, false)), Status.Code.NOT_FOUND, "holds no");
      assertRefused(ask(second, request(1, session, 1, false)), Status.Code.NOT_FOUND, "holds no");
      for (int i = 0; i < 3; i++) {
        try (FdTestClient beyond = client()) {
          assertTrue(beyond.closedByDaemon(), "connection " + (3 + i) + " closed at once");
        }
      }
      first.close();
      try (FdTestClient again = reconnectWithin(10)) {
        assertRefused(ask(again, request(1, session, 1, false)), Status.Code.NOT_FOUND, "holds no");
      }
      List<String> warnings = log.messages("WARN").stream().filter(m -> m.contains("connection(s)")).toList();
      assertEquals(1, warnings.size(), "3 refused in a minute: one line " + log.messages("WARN"));
      assertTrue(warnings.get(0).contains("refused 1 connection(s)") && warnings.get(0).contains("--fd-max-connections"),
          warnings.get(0));
    }
  }

  /** A connection the daemon keeps, once a closed one has left its count (bounded retries). */
  private FdTestClient reconnectWithin(int seconds) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
    while (true) {
      FdTestClient client = client();
      FdTestClient.Reply reply;
      try {
        client.send(request(0, UNKNOWN_SESSION, 1, false));
        reply = client.receive();
      } catch (IOException reset) {
        // Closed at once while the request was unread on the daemon's side: the close was a reset.
        reply = null;
      }
      if (reply != null) {
        return client;
      }
      client.close();
      if (System.nanoTime() > deadline) {
        throw new AssertionError("no connection kept within " + seconds + " s after one closed");
      }
      Thread.sleep(10);
    }
  }

  @Test
  void requestsBeyondTheRate_areRefused_untilTimeRefills_loggingOneLineAMinute() throws Exception {
    FakeTicker ticker = new FakeTicker();
    daemon = TestDaemon.start(ticker, withFd());
    try (LogCapture log = new LogCapture(FdChannel.class); FdTestClient client = client()) {
      for (int i = 1; i <= FdChannel.REQUESTS_PER_SECOND; i++) {
        assertRefused(ask(client, request(i, UNKNOWN_SESSION, 1, false)), Status.Code.NOT_FOUND, "not found");
      }
      assertRefused(ask(client, request(0, UNKNOWN_SESSION, 1, false)), Status.Code.RESOURCE_EXHAUSTED,
          "more than 1000 requests per second on one connection");

      ticker.advance(1, TimeUnit.SECONDS);
      assertRefused(ask(client, request(1, UNKNOWN_SESSION, 1, false)), Status.Code.NOT_FOUND, "not found");
      assertEquals(1, log.messages("WARN").size(), "1,002 refusals in a minute: one line " + log.messages("WARN"));
      ticker.advance(1, TimeUnit.MINUTES);
      assertRefused(ask(client, request(2, UNKNOWN_SESSION, 1, false)), Status.Code.NOT_FOUND, "not found");
      List<String> warnings = log.messages("WARN");
      assertEquals(2, warnings.size(), warnings.toString());
      // the first refusal had a line of its own; the other 1,002 are counted in the next
      assertTrue(warnings.get(1).contains("refused 1002 request(s) since the last such line"), warnings.get(1));
    }
  }
}
