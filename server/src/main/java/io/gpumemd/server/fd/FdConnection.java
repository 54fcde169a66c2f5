package io.gpumemd.server.fd;

import com.google.protobuf.InvalidProtocolBufferException;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentDescriptor;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.buffer.ByteBuf;
import io.grpc.netty.shaded.io.netty.buffer.ByteBufUtil;
import io.grpc.netty.shaded.io.netty.channel.ChannelFutureListener;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelInboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import io.grpc.netty.shaded.io.netty.handler.codec.TooLongFrameException;
import java.io.IOException;
import java.util.ArrayDeque;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One connection of the fd channel: takes its frames (after the length decoder), answers each
 * with {@link FdGrants}, and writes the reply's frame, then the descriptor when it grants one
 * (see the framing in {@code gpumemd.proto}, FdRequest).
 *
 * <p>Bounds, besides the channel's connection count: {@link FdChannel#REQUESTS_PER_SECOND}
 * per connection (a token bucket, full at first; beyond it RESOURCE_EXHAUSTED); the channel's
 * descriptors in flight ({@code --fd-max-in-flight}; beyond it RESOURCE_EXHAUSTED); and while
 * {@link FdChannel#MAX_UNSENT_PER_CONNECTION} of its descriptors wait unsent, its further
 * requests wait unanswered (holding no descriptor) and the connection is not read. A
 * descriptor is closed as soon as its write is done or has failed, and a failed write closes
 * the connection: Netty cannot queue a descriptor behind a full socket buffer (its {@code
 * sendFd} fails the write), so a peer that sends requests and never reads the replies may lose
 * its connection once its buffer is full.
 *
 * <p>Replies go out in request order: a request waits in {@link #waiting} until the ones before
 * it are answered, and a write's listener (which Netty may run at once, within the write)
 * answers the next ones from the same queue.
 *
 * <p>Thread-safety: every method runs on the connection's event loop; the channel's in-flight
 * count is shared and atomic.
 */
final class FdConnection extends ChannelInboundHandlerAdapter {
  private static final Logger log = LoggerFactory.getLogger(FdChannel.class);
  private static final int MAX_UNSENT = FdChannel.MAX_UNSENT_PER_CONNECTION;

  private final FdChannel channel;
  private final Caller peer;
  private double tokens = FdChannel.REQUESTS_PER_SECOND;
  private long tokensAtNanos;
  private int unsent;
  /** Requests read and not answered yet: more than one read's worth never waits. */
  private final ArrayDeque<FdRequest> waiting = new ArrayDeque<>();

  FdConnection(FdChannel channel, Caller peer) {
    this.channel = channel;
    this.peer = peer;
    this.tokensAtNanos = channel.ticker().nanos();
  }

  @Override
  public void channelRead(ChannelHandlerContext ctx, Object msg) {
    ByteBuf frame = (ByteBuf) msg;
    FdRequest request;
    try {
      request = FdRequest.parseFrom(ByteBufUtil.getBytes(frame));
    } catch (InvalidProtocolBufferException e) {
      refuseAndClose(ctx, "frame: " + frame.readableBytes() + " bytes that are not an FdRequest (expected: "
          + "a 4-byte big-endian length, then a serialized gpumemd.v1.FdRequest)");
      return;
    } finally {
      frame.release();
    }
    waiting.add(request);
    answerWaiting(ctx);
  }

  /**
   * Answers waiting requests in order while fewer than {@link #MAX_UNSENT} descriptors of this
   * connection wait unsent, and reads the connection only while none is left waiting. One read
   * may bring many frames: they wait here (bytes, not descriptors) rather than each opening one.
   */
  private void answerWaiting(ChannelHandlerContext ctx) {
    while (unsent < MAX_UNSENT && !waiting.isEmpty()) {
      FdGrants.Answer answer = admit(waiting.poll());
      if (answer.descriptor() == null) {
        channel.refusedRequest(peer, answer.reply());
      }
      send(ctx, answer);
    }
    boolean read = waiting.isEmpty() && unsent < MAX_UNSENT;
    if (ctx.channel().config().isAutoRead() != read) {
      ctx.channel().config().setAutoRead(read);
    }
  }

  /** The answer, unless a bound of this connection or the channel refuses it first. */
  private FdGrants.Answer admit(FdRequest request) {
    if (!takeToken()) {
      return refusal(request, Status.RESOURCE_EXHAUSTED.withDescription("fd channel: more than "
          + FdChannel.REQUESTS_PER_SECOND + " requests per second on one connection; retry later"));
    }
    if (!channel.reserveInFlight()) {
      return refusal(request, Status.RESOURCE_EXHAUSTED.withDescription("fd channel: " + channel.maxInFlight()
          + " descriptors are waiting to be sent, the limit (flag --fd-max-in-flight); retry later"));
    }
    FdGrants.Answer answer = channel.grants().answer(peer, request);
    if (answer.descriptor() == null) {
      channel.releaseInFlight();
    }
    return answer;
  }

  private static FdGrants.Answer refusal(FdRequest request, Status status) {
    return new FdGrants.Answer(FdGrants.refusal(request.getRequestId(), status), null);
  }

  private boolean takeToken() {
    long now = channel.ticker().nanos();
    double rate = FdChannel.REQUESTS_PER_SECOND;
    tokens = Math.min(rate, tokens + (now - tokensAtNanos) * rate / 1e9);
    tokensAtNanos = now;
    if (tokens < 1) {
      return false;
    }
    tokens -= 1;
    return true;
  }

  /** Writes one reply: its frame, then, when it grants one, the descriptor on a byte of its own. */
  private void send(ChannelHandlerContext ctx, FdGrants.Answer answer) {
    byte[] reply = answer.reply().toByteArray();
    ByteBuf frame = ctx.alloc().buffer(4 + reply.length).writeInt(reply.length).writeBytes(reply);
    SegmentDescriptor descriptor = answer.descriptor();
    if (descriptor == null) {
      ctx.writeAndFlush(frame).addListener(ChannelFutureListener.CLOSE_ON_FAILURE);
      return;
    }
    ctx.write(frame).addListener(ChannelFutureListener.CLOSE_ON_FAILURE);
    unsent++;
    // Netty's sendFd sends one byte with the descriptor (SCM_RIGHTS); the kernel gives the peer a
    // descriptor of its own at once, so ours is closed as soon as the write is done.
    ctx.writeAndFlush(new FileDescriptor(descriptor.number())).addListener(f -> {
      closeQuietly(descriptor);
      channel.releaseInFlight();
      unsent--;
      if (!f.isSuccess()) {
        log.debug("fd channel: sending a descriptor to {} failed: {}", peer, f.cause().toString());
        waiting.clear();
        ctx.close();
      } else {
        answerWaiting(ctx);
      }
    });
  }

  private void refuseAndClose(ChannelHandlerContext ctx, String why) {
    FdReply reply = FdGrants.refusal(0, Status.INVALID_ARGUMENT.withDescription(why));
    channel.refusedRequest(peer, reply);
    byte[] bytes = reply.toByteArray();
    ByteBuf frame = ctx.alloc().buffer(4 + bytes.length).writeInt(bytes.length).writeBytes(bytes);
    ctx.writeAndFlush(frame).addListener(ChannelFutureListener.CLOSE);
  }

  @Override
  public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
    if (cause instanceof TooLongFrameException) {
      refuseAndClose(ctx, "frame: longer than " + FdChannel.MAX_REQUEST_BYTES + " bytes (expected: a 4-byte "
          + "big-endian length in [1, " + FdChannel.MAX_REQUEST_BYTES + "], then an FdRequest)");
      return;
    }
    if (!(cause instanceof IOException)) {
      log.error("fd channel: unexpected failure on a connection of {}; closing it", peer, cause);
    } else {
      log.debug("fd channel: connection of {} failed: {}", peer, cause.toString());
    }
    ctx.close();
  }

  private static void closeQuietly(SegmentDescriptor descriptor) {
    try {
      descriptor.close();
    } catch (IOException e) {
      log.warn("fd channel: closing {} after its send: {}", descriptor, e.toString());
    }
  }
}
