package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.config.FdChannelConfig;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.buffer.ByteBuf;
import io.grpc.netty.shaded.io.netty.buffer.Unpooled;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelOutboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.channel.ChannelPromise;
import io.grpc.netty.shaded.io.netty.channel.embedded.EmbeddedChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import io.grpc.netty.shaded.io.netty.handler.codec.LengthFieldBasedFrameDecoder;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The fd channel's bounds on what a peer makes the daemon hold: descriptors in flight ({@code
 * --fd-max-in-flight}, {@code --fd-max-in-flight-per-tenant}) and unsent descriptors per
 * connection, on a connection whose writes the test holds back (an {@link EmbeddedChannel} in
 * front of the real {@link FdConnection}, with a real daemon's grants); the deadlines (stall,
 * first request, idle) on a {@link FakeTicker} that moves with the embedded event loop's clock;
 * and, over the real socket, a peer that asks and never reads, and one that never reads even its
 * refusals.
 */
class FdConnectionBoundsTest {
  private TestDaemon daemon;
  private final Caller me = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid(), 0,
      (int) ProcessHandle.current().pid());
  private final Caller other = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid() + 1000, 4242, 1);
  private final FakeTicker ticker = new FakeTicker();
  private String session;
  private long segment;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--host-segments", "fd");
    session = daemon.server().registry().open(me, "bounds", 0, -1).id();
    LeaseRecord lease = daemon.server().registry().lease(me, session, 0, 4096, false, "", false);
    segment = lease.block().segmentId();
  }

  @AfterEach
  void stop() {
    daemon.close();
  }

  /** Keeps every write pending until {@link #complete}: a peer whose socket takes nothing. */
  private static final class HeldWrites extends ChannelOutboundHandlerAdapter {
    final List<Object> messages = new ArrayList<>();
    final List<ChannelPromise> promises = new ArrayList<>();

    @Override
    public void write(ChannelHandlerContext ctx, Object msg, ChannelPromise promise) {
      messages.add(msg);
      promises.add(promise);
    }

    void complete() {
      List<ChannelPromise> done = new ArrayList<>(promises);
      promises.clear();
      done.forEach(ChannelPromise::setSuccess);
    }

    /** Completes the oldest held write: the peer read one message. */
    void completeOne() {
      promises.remove(0).setSuccess();
    }

    /** Fails what is held, as Netty fails the writes still queued when a channel closes. */
    @Override
    public void close(ChannelHandlerContext ctx, ChannelPromise promise) {
      List<ChannelPromise> failed = new ArrayList<>(promises);
      promises.clear();
      failed.forEach(p -> p.tryFailure(new ClosedChannelException()));
      ctx.close(promise);
    }

    /** The replies written so far (frames), in order. */
    List<FdReply> replies() throws Exception {
      List<FdReply> out = new ArrayList<>();
      for (Object m : messages) {
        if (m instanceof ByteBuf frame) {
          ByteBuf copy = frame.duplicate();
          byte[] body = new byte[copy.readInt()];
          copy.readBytes(body);
          out.add(FdReply.parseFrom(body));
        }
      }
      return out;
    }

    long descriptors() {
      return messages.stream().filter(m -> m instanceof FileDescriptor).count();
    }
  }

  private ByteBuf frame(long id) {
    return frame(id, session, segment);
  }

  private static ByteBuf frame(long id, String session, long segment) {
    return Unpooled.wrappedBuffer(FdRequest.newBuilder().setRequestId(id).setSessionId(session)
        .setSegmentId(segment).build().toByteArray());
  }

  private FdChannel channel(int maxInFlight) {
    return channel(maxInFlight, FdChannelConfig.DEFAULT_MAX_IN_FLIGHT_PER_TENANT);
  }

  /** A channel with the default deadlines on {@link #ticker}, and these bounds on descriptors in flight. */
  private FdChannel channel(int maxInFlight, int maxInFlightPerTenant) {
    FdChannelConfig defaults = FdChannelConfig.defaults(null);
    return new FdChannel(IdentityPolicy.defaults(), new FdGrants(daemon.server().registry(),
        new DescriptorPins(daemon.server().pools(), ticker)),
        new FdChannelConfig(null, 0, 0, maxInFlight, maxInFlightPerTenant, defaults.firstRequestMillis(),
            defaults.idleSeconds(), defaults.stallMillis()), ticker);
  }

  /** Moves the channel's ticker and the connection's event-loop clock together, and runs the tasks due. */
  private void pass(EmbeddedChannel connection, long millis) {
    ticker.advance(millis, TimeUnit.MILLISECONDS);
    connection.advanceTimeBy(millis, TimeUnit.MILLISECONDS);
    connection.runScheduledPendingTasks();
  }

  @Test
  void descriptorsInFlight_areBoundedOverTheChannel_andClosedOnceSent() throws Exception {
    FdChannel channel = channel(3);
    HeldWrites held = new HeldWrites();
    EmbeddedChannel connection = new EmbeddedChannel(held, new FdConnection(channel, me));
    long before = openDescriptors();

    for (long id = 1; id <= 4; id++) {
      connection.writeInbound(frame(id));
    }

    List<FdReply> replies = held.replies();
    assertEquals(4, replies.size());
    for (int i = 0; i < 3; i++) {
      assertEquals(FdReply.ResultCase.GRANTED, replies.get(i).getResultCase());
    }
    FdReply refused = replies.get(3);
    assertEquals(Status.Code.RESOURCE_EXHAUSTED.value(), refused.getRefused().getCode());
    assertTrue(refused.getRefused().getMessage().contains("3 descriptors are waiting to be sent, the limit (flag "
        + "--fd-max-in-flight)"), refused.getRefused().getMessage());
    assertEquals(3, held.descriptors());
    assertEquals(3, channel.inFlight());
    assertEquals(before + 3, openDescriptors(), "three descriptors opened, waiting");

    held.complete();
    assertEquals(0, channel.inFlight());
    assertEquals(before, openDescriptors(), "each closed once its write is done");
    connection.finishAndReleaseAll();
  }

  @Test
  void aConnectionWithSixteenDescriptorsUnsent_isReadNoMore_untilTheyGo() throws Exception {
    FdChannel channel = channel(1000);
    HeldWrites held = new HeldWrites();
    EmbeddedChannel connection = new EmbeddedChannel(held, new FdConnection(channel, me));

    for (long id = 1; id < FdChannel.MAX_UNSENT_PER_CONNECTION; id++) {
      connection.writeInbound(frame(id));
    }
    assertTrue(connection.config().isAutoRead(), "15 unsent: still read");
    connection.writeInbound(frame(16));
    assertFalse(connection.config().isAutoRead(), "16 unsent: not read until they drain");

    held.complete();
    assertTrue(connection.config().isAutoRead());
    assertEquals(0, channel.inFlight());
    connection.finishAndReleaseAll();
  }

  @Test
  void descriptorsInFlight_ofOneTenant_stopAtItsBound_whileAnotherTenantIsServed() throws Exception {
    String theirs = daemon.server().registry().open(other, "bounds", 0, -1).id();
    long theirSegment = daemon.server().registry().lease(other, theirs, 0, 4096, false, "", false).block().segmentId();
    FdChannel channel = channel(10, 3);
    HeldWrites mine = new HeldWrites();
    HeldWrites their = new HeldWrites();
    EmbeddedChannel myConnection = new EmbeddedChannel(mine, new FdConnection(channel, me));
    EmbeddedChannel theirConnection = new EmbeddedChannel(their, new FdConnection(channel, other));

    for (long id = 1; id <= 4; id++) {
      myConnection.writeInbound(frame(id));
    }
    theirConnection.writeInbound(frame(1, theirs, theirSegment));

    List<FdReply> replies = mine.replies();
    assertEquals(3, mine.descriptors(), "the tenant's bound: 3 in flight");
    FdReply refused = replies.get(3);
    assertEquals(Status.Code.RESOURCE_EXHAUSTED.value(), refused.getRefused().getCode());
    assertTrue(refused.getRefused().getMessage().contains("3 descriptors for tenant " + me.tenant() + " are "
        + "waiting to be sent, its limit (flag --fd-max-in-flight-per-tenant)"), refused.getRefused().getMessage());
    assertEquals(FdReply.ResultCase.GRANTED, their.replies().get(0).getResultCase(),
        "another tenant is served while the channel has room: " + their.replies());
    assertEquals(3, channel.inFlight(me.tenant()));
    assertEquals(1, channel.inFlight(other.tenant()));
    assertEquals(4, channel.inFlight());

    mine.complete();
    their.complete();
    assertEquals(0, channel.inFlight(me.tenant()));
    assertEquals(0, channel.inFlight());
    myConnection.finishAndReleaseAll();
    theirConnection.finishAndReleaseAll();
  }

  @Test
  void aConnectionWhoseRepliesStayUnwritten_isClosedAtTheStallDeadline_givingBackItsDescriptors() throws Exception {
    FdChannel channel = channel(100);
    HeldWrites held = new HeldWrites();
    long before = openDescriptors();
    try (LogCapture log = new LogCapture(FdChannel.class)) {
      EmbeddedChannel connection = new EmbeddedChannel(held, new FdConnection(channel, me));
      for (long id = 1; id <= 3; id++) {
        connection.writeInbound(frame(id));
      }
      assertEquals(3, channel.inFlight());
      assertEquals(before + 3, openDescriptors());

      long stall = FdChannelConfig.DEFAULT_STALL_MILLIS;
      pass(connection, stall - 1);
      assertTrue(connection.isOpen(), "nothing written for 1 ms less than the deadline");
      held.completeOne(); // the peer read the first reply's frame: its descriptor and the rest still wait
      pass(connection, stall - 1);
      assertTrue(connection.isOpen(), "the deadline counts from the last write done");
      pass(connection, 1);

      assertFalse(connection.isOpen(), "closed once no write was done for the deadline");
      assertEquals(0, channel.inFlight(), "its places in flight given back");
      assertEquals(0, channel.inFlight(me.tenant()));
      assertEquals(before, openDescriptors(), "the unsent descriptors closed");
      List<String> warnings = log.messages("WARN");
      assertEquals(1, warnings.size(), warnings.toString());
      assertTrue(warnings.get(0).contains("closed 1 connection(s)") && warnings.get(0).contains("unread for "
          + stall + " ms (flag --fd-stall-timeout-ms); 3 descriptor(s) it was not sent are closed"), warnings.get(0));
      connection.finishAndReleaseAll();
    }
  }

  @Test
  void aConnectionWithoutACompleteRequest_isClosedAtTheFirstRequestDeadline_halfAFrameNotCounting() {
    FdChannel channel = channel(100);
    try (LogCapture log = new LogCapture(FdChannel.class)) {
      EmbeddedChannel connection = new EmbeddedChannel(decoder(), new FdConnection(channel, me));
      connection.writeInbound(Unpooled.wrappedBuffer(new byte[] {0, 0}));

      pass(connection, FdChannelConfig.DEFAULT_FIRST_REQUEST_MILLIS - 1);
      assertTrue(connection.isOpen());
      pass(connection, 1);
      assertFalse(connection.isOpen(), "two bytes of a frame are no request");
      List<String> warnings = log.messages("WARN");
      assertEquals(1, warnings.size(), warnings.toString());
      assertTrue(warnings.get(0).contains("no complete request within 10000 ms of connecting (flag "
          + "--fd-first-request-timeout-ms)"), warnings.get(0));
      connection.finishAndReleaseAll();
    }
  }

  @Test
  void anIdleConnection_isClosedAtTheIdleDeadline_countedFromItsLastCompleteRequest_silently() {
    FdChannel channel = channel(100);
    try (LogCapture log = new LogCapture(FdChannel.class)) {
      EmbeddedChannel connection = new EmbeddedChannel(decoder(), new FdConnection(channel, me));
      connection.writeInbound(lengthPrefixed(frame(1)));
      assertEquals(2, connection.outboundMessages().size(), "answered: a frame and its descriptor");
      long idle = TimeUnit.SECONDS.toMillis(FdChannelConfig.DEFAULT_IDLE_SECONDS);

      pass(connection, idle / 2);
      connection.writeInbound(Unpooled.wrappedBuffer(new byte[] {0, 0})); // half a frame: no request
      pass(connection, idle / 2 - 1);
      assertTrue(connection.isOpen(), "no request for 1 ms less than the deadline");
      pass(connection, 1);
      assertFalse(connection.isOpen(), "idle: closed");
      assertEquals(List.of(), log.messages("WARN"), "a routine close: DEBUG only");
      connection.finishAndReleaseAll();
    }
  }

  private static LengthFieldBasedFrameDecoder decoder() {
    return new LengthFieldBasedFrameDecoder(4 + FdChannel.MAX_REQUEST_BYTES, 0, 4, 0, 4, true);
  }

  private static ByteBuf lengthPrefixed(ByteBuf body) {
    return Unpooled.buffer().writeInt(body.readableBytes()).writeBytes(body);
  }

  @Test
  void aPeerThatAsksAndNeverReads_makesTheDaemonHoldAtMostSixteenDescriptors_andNoneOnceGone() throws Exception {
    long before = openDescriptors();
    FdTestClient client = new FdTestClient(daemon.server().fdSocketPath());
    int sent = 0;
    try {
      for (; sent < 3000; sent++) {
        client.send(FdRequest.newBuilder().setRequestId(sent).setSessionId(session).setSegmentId(segment).build());
      }
    } catch (java.io.IOException e) {
      // the daemon reads no more of this connection (16 descriptors unsent), or has closed it
    }
    long held = openDescriptors() - before;
    assertTrue(sent > FdChannel.MAX_UNSENT_PER_CONNECTION, "sent " + sent);
    assertTrue(held <= FdChannel.MAX_UNSENT_PER_CONNECTION, held + " descriptors held for a peer that never reads");

    client.close();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (openDescriptors() > before && System.nanoTime() < deadline) {
      Thread.sleep(10);
    }
    assertEquals(before, openDescriptors(), "the daemon holds no descriptor of the dropped connection");
  }

  /**
   * This JVM's open descriptors of segments (memfds named {@code gpumemd-seg-...}), not all of its
   * descriptors: other threads (the daemon's, the JVM's own) open and close theirs while a test
   * counts, which once made a count of every descriptor one off under load.
   */
  private static long openDescriptors() throws Exception {
    try (Stream<Path> fds = Files.list(Path.of("/proc/self/fd"))) {
      return fds.filter(FdConnectionBoundsTest::namesASegment).count();
    }
  }

  private static boolean namesASegment(Path fd) {
    try {
      return Files.readSymbolicLink(fd).toString().contains("gpumemd-seg-");
    } catch (java.io.IOException e) {
      return false; // closed since it was listed
    }
  }

  @Test
  void aPeerThatNeverReadsEvenItsRefusals_isReadNoMore_onceItsRepliesQueue() throws Exception {
    // 10 MiB of requests the daemon refuses (an unknown session): each costs it a reply frame.
    FdRequest unknown = FdRequest.newBuilder().setRequestId(1).setSessionId("0123456789abcdef0123456789abcdef")
        .setSegmentId(1).build();
    byte[] body = unknown.toByteArray();
    ByteBuffer requests = ByteBuffer.allocateDirect(10 << 20);
    while (requests.remaining() >= 4 + body.length) {
      requests.putInt(body.length).put(body);
    }
    requests.flip();

    try (FdTestClient flooder = new FdTestClient(daemon.server().fdSocketPath())) {
      long lastProgress = System.nanoTime();
      while (requests.hasRemaining() && System.nanoTime() - lastProgress < TimeUnit.SECONDS.toNanos(2)) {
        if (flooder.offer(requests) > 0) {
          lastProgress = System.nanoTime();
        } else {
          Thread.sleep(5);
        }
      }
      // What the daemon took: the socket buffers, one read, and the replies up to the write-buffer mark.
      assertTrue(requests.position() < (2 << 20), requests.position() + " bytes of requests taken from a peer "
          + "that reads none of its replies");

      try (FdTestClient other = new FdTestClient(daemon.server().fdSocketPath())) {
        other.send(FdRequest.newBuilder().setRequestId(7).setSessionId(session).setSegmentId(segment).build());
        FdTestClient.Reply reply = other.receive();
        FdTestClient.closeQuietly(reply.fd());
        assertEquals(FdReply.ResultCase.GRANTED, reply.reply().getResultCase(), "another connection is served");
      }
    }
  }
}
