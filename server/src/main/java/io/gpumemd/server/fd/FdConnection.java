package io.gpumemd.server.fd;

import com.google.protobuf.InvalidProtocolBufferException;
import io.gpumemd.proto.v1.FdBound;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentFd;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.buffer.ByteBuf;
import io.grpc.netty.shaded.io.netty.channel.ChannelFuture;
import io.grpc.netty.shaded.io.netty.channel.ChannelFutureListener;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelInboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import io.grpc.netty.shaded.io.netty.handler.codec.TooLongFrameException;
import java.io.IOException;
import java.util.ArrayDeque;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One connection of the fd channel: takes its frames (after the length decoder), answers each
 * with {@link FdGrants}, and writes the reply's frame, then the descriptor when it grants one
 * (see the framing in {@code gpumemd.proto}, FdRequest).
 *
 * <p>Bounds, besides the channel's connection counts: {@link FdChannel#REQUESTS_PER_SECOND}
 * per connection (a token bucket, full at first; beyond it RESOURCE_EXHAUSTED); the descriptors
 * in flight of the channel and of the peer's tenant ({@code --fd-max-in-flight}, {@code
 * --fd-max-in-flight-per-tenant}; beyond either RESOURCE_EXHAUSTED); and while {@link
 * FdChannel#MAX_UNSENT_PER_CONNECTION} of its descriptors wait unsent, or its queued replies
 * pass {@link FdChannel#WRITE_BUFFER} (a peer that does not read even its refusals), its further
 * requests wait unanswered (holding no descriptor) and the connection is not read. A descriptor
 * is closed as soon as its write is done or has failed, and a failed write closes the
 * connection.
 *
 * <p>Deadlines, checked by one task per connection on its event loop against the channel's
 * {@link io.gpumemd.common.Ticker}: while replies are owed (a write not done, or a request
 * waiting), the connection is closed once none of its writes has been done for {@code
 * --fd-stall-timeout-ms}: a descriptor queues behind the frames of a peer that does not read
 * (Netty writes in order), so only closing the connection gives its places in flight back (the
 * failed writes close the descriptors). Else it is closed when its first complete request has
 * not come {@code --fd-first-request-timeout-ms} after it connected, or, later, after {@code
 * --fd-idle-timeout-seconds} without a complete request. Bytes of a frame do not count: a peer
 * that sends two bytes of a frame and stops is closed like one that sends nothing.
 *
 * <p>Pushes (see "Pushed descriptors" in {@code gpumemd.proto}): a bind request ties one of
 * the peer's sessions to this connection ({@link ConnectionBindings}); a lease of that session
 * in a segment it was not sent here yet then pushes the descriptor, on the Allocator service's
 * thread ({@link ConnectionPushes}), which shares the socket with this handler's writes.
 *
 * <p>A fetch's grant passes the daemon's {@link io.gpumemd.server.books.BooksGate} (a push's
 * passed it with its lease): while a hand-over has the gate closed, the fetch and the requests
 * after it wait, unanswered and unread, for its end ({@link #waitForHandOver}).
 *
 * <p>Replies go out in request order: a request waits in {@link #waiting} until the ones before
 * it are answered, and a write's listener (which Netty may run at once, within the write)
 * answers the next ones from the same queue.
 *
 * <p>Thread-safety: every method runs on the connection's event loop but {@link
 * #pushBeforeReply}, which hands over to {@link ConnectionPushes} (thread-safe); the channel's
 * in-flight counts are shared and atomic.
 */
final class FdConnection extends ChannelInboundHandlerAdapter {
  private static final Logger log = LoggerFactory.getLogger(FdChannel.class);
  private static final int MAX_UNSENT = FdChannel.MAX_UNSENT_PER_CONNECTION;

  private final FdChannel channel;
  private final Caller peer;
  private final String tenant;
  private double tokens = FdChannel.REQUESTS_PER_SECOND;
  private long tokensAtNanos;
  private int unsent;
  /** Requests read and not answered yet: more than one read's worth never waits. */
  private final ArrayDeque<FdRequest> waiting = new ArrayDeque<>();
  /** The first of {@link #waiting} is a fetch waiting for a hand-over's end ({@link #waitForHandOver}). */
  private boolean heldForHandOver;
  /** Writes (frames and descriptors) handed to Netty and not done yet. */
  private int pendingWrites;
  private final long connectedNanos;
  /** Whether a complete request has come. */
  private boolean requested;
  /** The last complete request, or the last write done: when the connection fell quiet. */
  private long quietSinceNanos;
  /** The last write done, or when writes began to wait after none did: what a stall counts from. */
  private long progressNanos;
  private ScheduledFuture<?> deadlineCheck;
  /** The pushes of this connection's bound sessions, and who writes on its socket. */
  private final ConnectionPushes pushes;
  /** The sessions this connection bound, and what each was sent here (any thread). */
  private final ConnectionBindings bindings = new ConnectionBindings();

  FdConnection(FdChannel channel, Caller peer) {
    this.channel = channel;
    this.peer = peer;
    this.tenant = peer.tenant();
    this.tokensAtNanos = channel.ticker().nanos();
    this.connectedNanos = tokensAtNanos;
    this.pushes = new ConnectionPushes(channel, peer, bindings, this);
  }

  @Override
  public void handlerAdded(ChannelHandlerContext ctx) {
    pushes.attach(ctx);
    armDeadlineCheck(ctx, Math.min(channel.firstRequestNanos(), channel.checkEveryNanos()));
  }

  @Override
  public void channelInactive(ChannelHandlerContext ctx) {
    cancelDeadlineCheck();
    for (String session : bindings.sessions()) {
      channel.pushes().unbind(session, this);
    }
    pushes.close();
    ctx.fireChannelInactive();
  }

  /** On the event loop, as the connection closes: no push is sent from here on (see {@link ConnectionEnd}). */
  void stopPushes() {
    pushes.close();
  }

  @Override
  public void handlerRemoved(ChannelHandlerContext ctx) {
    cancelDeadlineCheck();
  }

  @Override
  public void channelWritabilityChanged(ChannelHandlerContext ctx) {
    if (ctx.channel().isWritable()) {
      answerWaiting(ctx);
    }
    ctx.fireChannelWritabilityChanged();
  }

  @Override
  public void channelRead(ChannelHandlerContext ctx, Object msg) {
    ByteBuf frame = (ByteBuf) msg;
    requested = true;
    quietSinceNanos = channel.ticker().nanos();
    FdRequest request;
    try {
      request = FdRequest.parseFrom(frame.nioBuffer()); // no copy: the frame is released below
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
   * connection wait unsent and its queued replies leave it writable, and reads the connection
   * only while none is left waiting. One read may bring many frames: they wait here (bytes, not
   * descriptors) rather than each opening one.
   */
  private void answerWaiting(ChannelHandlerContext ctx) {
    while (!heldForHandOver && unsent < MAX_UNSENT && ctx.channel().isWritable() && !waiting.isEmpty()) {
      FdRequest request = waiting.peek();
      // A fetch's grant makes a holder in the books: not while a hand-over writes them down (the
      // successor would not know the process holds the segment), so it waits for the hand-over.
      boolean fetch = !request.getBind();
      if (fetch && !channel.gate().enter()) {
        waitForHandOver(ctx);
        break;
      }
      waiting.poll();
      FdGrants.Answer answer;
      try {
        answer = admit(request);
      } finally {
        if (fetch) {
          channel.gate().exit();
        }
      }
      if (answer.reply().hasRefused()) { // a bind's reply carries no descriptor either
        channel.refusedRequest(peer, answer.reply());
      }
      send(ctx, answer);
    }
    boolean read = !heldForHandOver && waiting.isEmpty() && unsent < MAX_UNSENT && ctx.channel().isWritable();
    if (ctx.channel().config().isAutoRead() != read) {
      ctx.channel().config().setAutoRead(read);
    }
  }

  /**
   * The gate refused the fetch at the head of {@link #waiting}: a hand-over has it closed. The
   * fetch waits, unanswered and the connection unread, for the hand-over's end: answered here if
   * the gate opens again; if the successor serves, the connection is closed without its answer,
   * and the client fetches again on a new connection, from the successor, whose books are the
   * ones that count (both clients try once more on a connection that closed).
   */
  private void waitForHandOver(ChannelHandlerContext ctx) {
    heldForHandOver = true;
    if (channel.gate().hold(moved -> onLoop(ctx, () -> handOverEnded(ctx, moved)))) {
      return;
    }
    // Nothing holds it: the hand-over ended meanwhile (the gate is open again), or none has the
    // gate closed (this daemon handed over, and the socket path is its successor's; a successor
    // that does not serve yet).
    onLoop(ctx, () -> handOverEnded(ctx, channel.gate().closed()));
  }

  private void handOverEnded(ChannelHandlerContext ctx, boolean moved) {
    heldForHandOver = false;
    if (!ctx.channel().isActive()) {
      return;
    }
    if (moved) {
      log.debug("fd channel: closing the connection of {}: its session moved to the successor, which answers "
          + "its fetch", peer);
      waiting.clear();
      ctx.close();
      return;
    }
    answerWaiting(ctx);
  }

  /** Runs {@code task} on the connection's event loop, unless that has stopped (the connection with it). */
  private static void onLoop(ChannelHandlerContext ctx, Runnable task) {
    try {
      ctx.executor().execute(task);
    } catch (RejectedExecutionException e) {
      // the daemon is stopping: the connection closes with its event loop
    }
  }

  /** The answer, unless a bound of this connection or the channel refuses it first. */
  private FdGrants.Answer admit(FdRequest request) {
    if (!takeToken()) {
      return refusal(request, Status.RESOURCE_EXHAUSTED.withDescription("fd channel: more than "
          + FdChannel.REQUESTS_PER_SECOND + " requests per second on one connection; retry later"));
    }
    if (request.getBind()) {
      return bind(request);
    }
    Status full = channel.reserveInFlight(tenant);
    if (full != null) {
      return refusal(request, full);
    }
    FdGrants.Answer answer = channel.grants().answer(peer, request);
    if (answer.descriptor() == null) {
      channel.releaseInFlight(tenant);
    } else {
      bindings.fetched(request.getSessionId(), request.getSegmentId());
    }
    return answer;
  }

  /** Binds the request's session to this connection, when it is of the peer's tenant. */
  private FdGrants.Answer bind(FdRequest request) {
    FdReply refused = channel.grants().refusedBind(peer, request);
    if (refused == null) {
      refused = pushes.open(request.getRequestId());
    }
    if (refused != null) {
      return new FdGrants.Answer(refused, null);
    }
    String evicted = bindings.bind(request.getSessionId(), request.getRequestId());
    if (evicted != null) {
      channel.pushes().unbind(evicted, this);
    }
    channel.pushes().bind(request.getSessionId(), this);
    return new FdGrants.Answer(FdReply.newBuilder().setRequestId(request.getRequestId())
        .setBound(FdBound.getDefaultInstance()).build(), null);
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

  /**
   * Writes one reply: its frame, then, when it grants one, the descriptor on a byte of its own.
   * Returns the future of its last write.
   */
  private ChannelFuture send(ChannelHandlerContext ctx, FdGrants.Answer answer) {
    byte[] reply = answer.reply().toByteArray();
    ByteBuf frame = ctx.alloc().buffer(4 + reply.length).writeInt(reply.length).writeBytes(reply);
    SegmentFd descriptor = answer.descriptor();
    if (descriptor == null) {
      return write(ctx, frame, true).addListener(ChannelFutureListener.CLOSE_ON_FAILURE);
    }
    write(ctx, frame, false).addListener(ChannelFutureListener.CLOSE_ON_FAILURE);
    unsent++;
    // Netty's sendFd sends one byte with the descriptor (SCM_RIGHTS); the kernel gives the peer a
    // descriptor of its own at once, so ours is closed as soon as the write is done. A write that
    // fails, also because the connection closed with it still queued, closes it just the same.
    return write(ctx, new FileDescriptor(descriptor.number()), true).addListener(f -> {
      closeQuietly(descriptor);
      channel.releaseInFlight(tenant);
      unsent--;
      if (!f.isSuccess()) {
        channel.descriptorSendFailed(peer, f.cause());
        waiting.clear();
        ctx.close();
      } else {
        answerWaiting(ctx);
      }
    });
  }

  /** Hands one message to Netty, keeping the count of writes not done that the stall deadline watches. */
  private ChannelFuture write(ChannelHandlerContext ctx, Object message, boolean flush) {
    if (pendingWrites++ == 0) {
      pushes.takeWriterForLoop();
      progressNanos = channel.ticker().nanos();
    }
    ChannelFuture written = flush ? ctx.writeAndFlush(message) : ctx.write(message);
    written.addListener(f -> {
      pendingWrites--;
      progressNanos = channel.ticker().nanos();
      if (pendingWrites == 0) {
        quietSinceNanos = progressNanos;
        pushes.releaseWriterForLoop();
      }
    });
    return written;
  }



  /** See {@link ConnectionPushes#push}: called by the Allocator service's threads. */
  void pushBeforeReply(String sessionId, long segmentId) {
    pushes.push(sessionId, segmentId);
  }

  /**
   * On the event loop: sends a pushed answer as a reply (its descriptor closed and its place in
   * flight given back once written), unless the connection closed or owes replies; returns
   * false when it did not (the caller closes the descriptor and gives the place back).
   */
  boolean sendPush(ChannelHandlerContext ctx, FdGrants.Answer answer, Runnable whenWritten) {
    if (!ctx.channel().isActive() || !waiting.isEmpty() || unsent >= MAX_UNSENT) {
      return false;
    }
    send(ctx, answer).addListener(f -> whenWritten.run());
    return true;
  }

  private void armDeadlineCheck(ChannelHandlerContext ctx, long delayNanos) {
    deadlineCheck = ctx.executor().schedule(() -> checkDeadlines(ctx), Math.max(delayNanos, 1), TimeUnit.NANOSECONDS);
  }

  private void cancelDeadlineCheck() {
    if (deadlineCheck != null) {
      deadlineCheck.cancel(false);
      deadlineCheck = null;
    }
  }

  /**
   * Closes the connection past the deadline that applies to its state (see the class comment),
   * or checks again when it may be due: at the latest after {@link FdChannel#checkEveryNanos},
   * since a change of state (a reply owed) can start a shorter deadline than the one checked.
   */
  private void checkDeadlines(ChannelHandlerContext ctx) {
    deadlineCheck = null;
    if (!ctx.channel().isActive()) {
      return;
    }
    long now = channel.ticker().nanos();
    long left;
    if (heldForHandOver && pendingWrites == 0) {
      // Not the peer's stall: the hand-over's own deadlines bound the wait, and a close would
      // fail a fetch that the gate's opening or the successor answers.
      progressNanos = now;
      left = channel.checkEveryNanos();
    } else if (pendingWrites > 0 || !waiting.isEmpty()) {
      left = channel.stallNanos() - (now - progressNanos);
      if (left <= 0) {
        closePastDeadline(ctx, "its replies went unread for " + TimeUnit.NANOSECONDS.toMillis(channel.stallNanos())
            + " ms (flag --fd-stall-timeout-ms); " + unsent + " descriptor(s) it was not sent are closed");
        return;
      }
    } else if (!requested) {
      left = channel.firstRequestNanos() - (now - connectedNanos);
      if (left <= 0) {
        closePastDeadline(ctx, "no complete request within " + TimeUnit.NANOSECONDS.toMillis(channel.firstRequestNanos())
            + " ms of connecting (flag --fd-first-request-timeout-ms)");
        return;
      }
    } else if (channel.idleNanos() > 0) {
      left = channel.idleNanos() - (now - quietSinceNanos);
      if (left <= 0) {
        log.debug("fd channel: closing the idle connection of {}: no request for {} s (flag "
            + "--fd-idle-timeout-seconds)", peer, TimeUnit.NANOSECONDS.toSeconds(channel.idleNanos()));
        waiting.clear();
        ctx.close();
        return;
      }
    } else {
      left = Long.MAX_VALUE;
    }
    armDeadlineCheck(ctx, Math.min(left, channel.checkEveryNanos()));
  }

  private void closePastDeadline(ChannelHandlerContext ctx, String why) {
    channel.closedPastDeadline(peer, why);
    waiting.clear();
    ctx.close();
  }

  private void refuseAndClose(ChannelHandlerContext ctx, String why) {
    FdReply reply = FdGrants.refusal(0, Status.INVALID_ARGUMENT.withDescription(why));
    channel.refusedRequest(peer, reply);
    byte[] bytes = reply.toByteArray();
    ByteBuf frame = ctx.alloc().buffer(4 + bytes.length).writeInt(bytes.length).writeBytes(bytes);
    // A peer that does not read this either is closed by the stall deadline.
    write(ctx, frame, true).addListener(ChannelFutureListener.CLOSE);
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

  private static void closeQuietly(SegmentFd descriptor) {
    try {
      descriptor.close();
    } catch (IOException e) {
      log.warn("fd channel: closing {} after its send: {}", descriptor, e.toString());
    }
  }
}
