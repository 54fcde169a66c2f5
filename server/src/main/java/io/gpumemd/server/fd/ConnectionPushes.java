package io.gpumemd.server.fd;

import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.MessageBuffer;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentFd;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The pushes of one fd-channel connection (see "Pushed descriptors" in {@code gpumemd.proto}):
 * a lease of a session bound there, in a segment the connection was not sent for it yet ({@link
 * ConnectionBindings}), pushes the segment's descriptor before its Lease reply. The push runs on
 * the Allocator service's thread, so that it is in the peer's socket when the reply leaves
 * without a hop to the event loop and back: the grant as a fetch gets it ({@link FdGrants}: in
 * flight while sent, the process made a holder of the segment), then its frame and its
 * descriptor's byte in one {@code sendmmsg} on a descriptor of the socket of its own ({@link
 * #pushSocket}, made at the first bind). Nothing is pushed, and the client asks, when the
 * connection closed, the peer has more than {@link FdChannel#MAX_UNREAD_FOR_PUSH} bytes of sends
 * unread (a client that never reads its pushes holds a few), or a bound of the channel refuses.
 *
 * <p>The event loop and a push never write at once: {@link #writer} is the loop's from its first
 * write not done to the last one done, a push's for its one send. A push that finds the loop
 * writing waits {@link #PUSH_SPIN_NANOS}, then hands itself to the loop (most often the loop has
 * written, and only the listener of a reply the client has already read has not run yet: a loop
 * thread preempted as its send woke the client) and waits for it up to {@link
 * FdChannel#PUSH_WAIT_MILLIS}.
 *
 * <p>Thread-safety: {@link #push} on any thread; {@link #attach}, {@link #open}, {@link #close}
 * and the writer's loop side on the connection's event loop. The push socket and buffer are
 * guarded by the writer; {@link #close} closes them once no push is under way.
 */
final class ConnectionPushes {
  private static final Logger log = LoggerFactory.getLogger(FdChannel.class);

  private final FdChannel channel;
  private final Caller peer;
  private final String tenant;
  private final ConnectionBindings bindings;
  private final FdConnection connection;
  /** Set when the handler is added: a push that broke the stream closes the connection through it. */
  private volatile ChannelHandlerContext context;
  /** Who writes on the socket: nobody, the event loop (writes not done yet), or a push. */
  private final AtomicInteger writer = new AtomicInteger(IDLE);
  private static final int IDLE = 0;
  private static final int LOOP = 1;
  private static final int PUSHING = 2;
  private static final long PUSH_SPIN_NANOS = TimeUnit.MICROSECONDS.toNanos(50);
  /**
   * A descriptor of the connection's socket of its own, made at the first bind, so that a push
   * on another thread never writes to a number Netty closed and the process reused; closed by
   * {@link #close}, with the native buffer pushes are sent from.
   */
  private volatile int pushSocket = -1;
  private MessageBuffer pushBuffer; // guarded by writer: used by a push, closed by closePushes
  private volatile boolean pushClosed;

  /**
   * At a bind, on the event loop: makes {@link #pushSocket} and its buffer unless made already;
   * null when done, else the refusal of the bind.
   */
  FdReply open(long requestId) {
    if (pushSocket >= 0) {
      return null;
    }
    if (!(context.channel() instanceof EpollDomainSocketChannel socket)) {
      return FdGrants.refusal(requestId, Status.UNIMPLEMENTED.withDescription("fd channel: no pushes here"));
    }
    int dup = -1;
    try {
      dup = UnixSockets.dupOf(socket.fd().intValue());
      pushBuffer = new MessageBuffer(FdChannel.MAX_PUSH_BYTES, 1);
      pushSocket = dup;
      return null;
    } catch (IOException | RuntimeException | LinkageError e) {
      Descriptors.closeQuietly(dup);
      return FdGrants.refusal(requestId, Status.RESOURCE_EXHAUSTED.withDescription("fd channel: cannot bind: "
          + e.getMessage()));
    }
  }

  /**
   * Pushes the descriptor of {@code segmentId} for {@code sessionId} unless this connection was
   * sent it for that session already: on the calling thread (the Allocator service's, before its
   * Lease reply), so that the push is in the peer's socket when the reply leaves, without a hop
   * to the event loop and back. Only while the event loop writes nothing here ({@link #writer}),
   * the connection is open, its peer has at most {@link FdChannel#MAX_UNREAD_FOR_PUSH} bytes of
   * sends unread, and the channel's bounds allow; counted as a fetch is (in flight while it is
   * sent, the process made a holder of the segment). Else nothing is pushed: the client asks.
   * Never throws.
   */
  void push(String sessionId, long segmentId) {
    long bindRequestId = bindings.firstSend(sessionId, segmentId);
    if (bindRequestId < 0) {
      return;
    }
    if (pushClosed || channel.reserveInFlight(tenant) != null) {
      bindings.forget(sessionId, segmentId); // the client asks for it this once
      return;
    }
    // The grant before the writer is taken: the event loop never waits on a registry lookup.
    FdGrants.Answer answer = channel.grants().answer(peer, FdRequest.newBuilder().setRequestId(bindRequestId)
        .setSessionId(sessionId).setSegmentId(segmentId).build(), true);
    if (answer.descriptor() == null) {
      channel.releaseInFlight(tenant);
      bindings.forget(sessionId, segmentId);
      return;
    }
    if (takeWriterForPush()) {
      pushHere(answer, sessionId, segmentId);
    } else {
      pushThroughLoop(answer, sessionId, segmentId);
    }
  }

  /** The push on the calling thread, which holds {@link #writer}; releases it, the descriptor and its place. */
  private void pushHere(FdGrants.Answer answer, String sessionId, long segmentId) {
    boolean pushed = false;
    boolean broken = false;
    try {
      if (!pushClosed && unreadByPeer(pushSocket) <= FdChannel.MAX_UNREAD_FOR_PUSH) {
        broken = true; // until both messages are sent: half a push leaves the stream out of step
        byte[] reply = answer.reply().toByteArray();
        byte[] frame = ByteBuffer.allocate(4 + reply.length).putInt(reply.length).put(reply).array();
        // The frame, then the descriptor on a byte of its own, as the event loop writes them,
        // in one call: the peer has at most MAX_UNREAD_FOR_PUSH bytes unread, so room for both.
        pushBuffer.sendWithDescriptorAfter(pushSocket, frame, 0, frame.length, answer.descriptor().number());
        broken = false;
        pushed = true;
      }
    } catch (IOException | RuntimeException e) {
      log.debug("fd channel: a push to {} failed: {}", peer, e.toString());
    } finally {
      writer.set(IDLE);
      closeQuietly(answer.descriptor());
      channel.releaseInFlight(tenant);
    }
    if (!pushed) {
      bindings.forget(sessionId, segmentId); // the client asks for it this once
    }
    ChannelHandlerContext ctx = context;
    if (broken && ctx != null) {
      ctx.executor().execute(ctx::close);
    }
  }

  /**
   * The push handed to the event loop, which is still writing here (most often only the
   * listener of a reply the client has read already has not run yet: a loop thread preempted
   * as its send woke the client), and waited for at most {@link FdChannel#PUSH_WAIT_MILLIS}.
   * Past that the Lease reply goes; the client asks, and sets the push aside when it comes.
   */
  private void pushThroughLoop(FdGrants.Answer answer, String sessionId, long segmentId) {
    ChannelHandlerContext ctx = context;
    CompletableFuture<Void> done = new CompletableFuture<>();
    try {
      ctx.executor().execute(() -> {
        if (!connection.sendPush(ctx, answer, () -> done.complete(null))) {
          closeQuietly(answer.descriptor());
          channel.releaseInFlight(tenant);
          bindings.forget(sessionId, segmentId);
          done.complete(null);
        }
      });
    } catch (RejectedExecutionException e) {
      closeQuietly(answer.descriptor());
      channel.releaseInFlight(tenant);
      bindings.forget(sessionId, segmentId);
      return;
    }
    try {
      done.get(FdChannel.PUSH_WAIT_MILLIS, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (ExecutionException | TimeoutException e) {
      log.debug("fd channel: a push to {} did not go out in time: {}", peer, e.toString());
    }
  }

  /**
   * Takes {@link #writer} for a push, waiting at most {@link #PUSH_SPIN_NANOS} for the event loop
   * to finish: a reply the client already read may not have run its write's listener yet.
   */
  private boolean takeWriterForPush() {
    long deadline = 0;
    while (!writer.compareAndSet(IDLE, PUSHING)) {
      long now = System.nanoTime();
      if (deadline == 0) {
        deadline = now + PUSH_SPIN_NANOS;
      } else if (now - deadline > 0) {
        return false;
      }
      Thread.onSpinWait();
    }
    return true;
  }

  /**
   * Takes {@link #writer} for the event loop before its first write that is not done yet: a push
   * under way on another thread ends within microseconds (two sends of a few bytes).
   */
  void takeWriterForLoop() {
    while (!writer.compareAndSet(IDLE, LOOP)) {
      Thread.onSpinWait();
    }
  }

  /** The event loop's last write was done. */
  void releaseWriterForLoop() {
    writer.set(IDLE);
  }

  /**
   * On the event loop, as the connection closes ({@link ConnectionEnd}, before it asks the kernel
   * what the peer left unread) and once it is inactive: no push sends any more, and the
   * connection's own descriptor for pushes is closed once none is under way. Idempotent.
   */
  void close() {
    // A push takes the writer and then reads pushClosed; this sets it and then reads the writer:
    // either the push sees it closed and sends nothing, or this waits until its send is done.
    pushClosed = true;
    while (writer.get() == PUSHING) {
      Thread.onSpinWait();
    }
    if (pushSocket >= 0) {
      Descriptors.closeQuietly(pushSocket);
      pushSocket = -1;
      pushBuffer.close();
    }
  }

  /** What the peer has not read of the connection's sends ({@code SIOCOUTQ}); MAX_VALUE when unknown. */
  private static int unreadByPeer(int socket) {
    try {
      return UnixSockets.queuedForPeer(socket);
    } catch (IOException | LinkageError | RuntimeException e) {
      return Integer.MAX_VALUE;
    }
  }

  /** The connection's context, when its handler is added. */
  void attach(ChannelHandlerContext ctx) {
    context = ctx;
  }

  ConnectionPushes(FdChannel channel, Caller peer, ConnectionBindings bindings, FdConnection connection) {
    this.channel = channel;
    this.peer = peer;
    this.tenant = peer.tenant();
    this.bindings = bindings;
    this.connection = connection;
  }

  private static void closeQuietly(SegmentFd descriptor) {
    try {
      descriptor.close();
    } catch (IOException e) {
      log.warn("fd channel: closing {} after its push: {}", descriptor, e.toString());
    }
  }
}
