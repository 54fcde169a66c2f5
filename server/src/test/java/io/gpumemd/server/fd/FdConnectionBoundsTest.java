package io.gpumemd.server.fd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.config.FdChannelConfig;
import io.gpumemd.server.session.LeaseRecord;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.buffer.ByteBuf;
import io.grpc.netty.shaded.io.netty.buffer.Unpooled;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelOutboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.channel.ChannelPromise;
import io.grpc.netty.shaded.io.netty.channel.embedded.EmbeddedChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
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
 * --fd-max-in-flight}) and unsent descriptors per connection, on a connection whose writes the
 * test holds back (an {@link EmbeddedChannel} in front of the real {@link FdConnection}, with a
 * real daemon's grants); and, over the real socket, a peer that asks and never reads.
 */
class FdConnectionBoundsTest {
  private TestDaemon daemon;
  private final Caller me = IdentityPolicy.defaults().unixPeer(IdentityPolicy.currentUid(), 0,
      (int) ProcessHandle.current().pid());
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
    return Unpooled.wrappedBuffer(FdRequest.newBuilder().setRequestId(id).setSessionId(session)
        .setSegmentId(segment).build().toByteArray());
  }

  private FdChannel channel(int maxInFlight) {
    return new FdChannel(IdentityPolicy.defaults(), new FdGrants(daemon.server().registry(), new DescriptorPins(daemon.server().pools(), io.gpumemd.common.Ticker.system())),
        new FdChannelConfig(null, 0, maxInFlight), System::nanoTime);
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
    long held = openDescriptors() - before - 2; // less the connection's two ends (this JVM is both)
    assertTrue(sent > FdChannel.MAX_UNSENT_PER_CONNECTION, "sent " + sent);
    assertTrue(held <= FdChannel.MAX_UNSENT_PER_CONNECTION, held + " descriptors held for a peer that never reads");

    client.close();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (openDescriptors() > before && System.nanoTime() < deadline) {
      Thread.sleep(10);
    }
    assertEquals(before, openDescriptors(), "the daemon holds no descriptor of the dropped connection");
  }

  private static long openDescriptors() throws Exception {
    try (Stream<Path> fds = Files.list(Path.of("/proc/self/fd"))) {
      return fds.count();
    }
  }
}
