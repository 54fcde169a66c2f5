package io.gpumemd.server.fd;

import io.gpumemd.common.unix.UnixSockets;
import io.grpc.netty.shaded.io.netty.channel.ChannelDuplexHandler;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelPromise;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.socket.ChannelInputShutdownEvent;
import io.gpumemd.server.auth.Caller;
import java.io.IOException;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * How an fd-channel connection ends, for {@link DescriptorPins}: whether the peer may still hold
 * a descriptor it never read. A Unix socket that the peer only shut down for writing keeps what
 * the daemon sent in its receive queue, readable after the daemon closed its end: a process with
 * such a queue may map a segment later, whatever {@code /proc} shows now. So before the daemon
 * closes a connection it asks the kernel how many bytes it sent wait unread ({@code SIOCOUTQ},
 * which for a Unix stream socket counts what sits in the peer's queue; a peer that closed its
 * socket has none). Only a connection that ends with nothing unread lets a live process's
 * holders end on the word of {@code /proc}; any other end (including one this handler did not
 * see: the channel closed under it) keeps them until the process exits.
 *
 * <p>A connection whose peer has replies unread is not closed at all, but kept (its reading
 * stopped) until the peer reads them or closes its socket, checked every {@link #RECHECK_MILLIS}:
 * the descriptors in them are in flight, and Linux charges descriptors in flight to the
 * <em>sender's</em> user, against its {@code RLIMIT_NOFILE} ({@code ETOOMANYREFS} past it, for
 * every send of the daemon, unless it has {@code CAP_SYS_RESOURCE}). Closed, such a connection
 * would give its place back while its descriptors stayed in flight, and a peer that fetches,
 * shuts its end and never reads could fill the daemon's user's share in a loop. Kept, it keeps
 * its place under {@code --fd-max-connections} and {@code --fd-max-connections-per-tenant}, so
 * what is in flight is bounded by those connections times a socket buffer. It sends nothing more
 * (its output is shut down, and the replies still queued in it fail, giving their places in
 * flight back). The daemon's own stop closes it all the same (the event loop closes every
 * channel under this handler).
 *
 * <p>The channel runs with half-closure allowed, so that a peer's end of input reaches this
 * handler (which closes the connection) instead of closing the socket unseen. First in the
 * pipeline: every close on the way to the socket passes it.
 *
 * <p>Thread-safety: runs on the connection's event loop.
 */
final class ConnectionEnd extends ChannelDuplexHandler {
  private static final Logger log = LoggerFactory.getLogger(FdChannel.class);
  /** How often a connection kept for its unread replies is looked at again. */
  static final long RECHECK_MILLIS = 200;

  private final DescriptorPins pins;
  private final Caller peer;
  private final Runnable stopPushes;
  private boolean ended;
  /** A close waits for the peer to read what it was sent. */
  private boolean waiting;

  /**
   * @param stopPushes stops the connection's pushes, waiting out one under way ({@link
   *     ConnectionPushes#close}): a push sent on its own descriptor of the socket after the kernel
   *     was asked would reach the peer's queue unseen
   */
  ConnectionEnd(DescriptorPins pins, Caller peer, Runnable stopPushes) {
    this.pins = pins;
    this.peer = peer;
    this.stopPushes = stopPushes;
  }

  @Override
  public void userEventTriggered(ChannelHandlerContext ctx, Object event) throws Exception {
    if (event instanceof ChannelInputShutdownEvent) {
      ctx.channel().close(); // through the whole pipeline, this handler included: the peer sends nothing more
    }
    super.userEventTriggered(ctx, event);
  }

  @Override
  public void close(ChannelHandlerContext ctx, ChannelPromise promise) throws Exception {
    if (ended) {
      super.close(ctx, promise);
      return;
    }
    stopPushes.run();
    int unread = unread(ctx);
    if (unread > 0) {
      // Completed by the real close, whenever the peer lets it happen.
      ctx.channel().closeFuture().addListener(f -> promise.trySuccess());
      if (!waiting) {
        waiting = true;
        ctx.channel().config().setAutoRead(false);
        // Sends nothing more: the replies Netty still queues fail, their descriptors closed and
        // their places in flight given back, as the close would have.
        ((EpollDomainSocketChannel) ctx.channel()).shutdownOutput();
        log.debug("fd channel: {} ended with {} bytes of replies unread: its connection stays open, and counted, "
            + "until it reads them or closes its socket (their descriptors are in flight)", peer, unread);
        recheck(ctx);
      }
      return;
    }
    ended = true;
    pins.disconnected(peer, unread == 0);
    super.close(ctx, promise);
  }

  private void recheck(ChannelHandlerContext ctx) {
    ctx.executor().schedule(() -> {
      if (ended || !ctx.channel().isOpen()) {
        return;
      }
      if (unread(ctx) > 0) {
        recheck(ctx);
      } else {
        ctx.channel().close();
      }
    }, RECHECK_MILLIS, TimeUnit.MILLISECONDS);
  }

  @Override
  public void channelInactive(ChannelHandlerContext ctx) throws Exception {
    if (!ended) {
      ended = true; // closed under this handler: nobody asked the kernel, so assume the worst
      pins.disconnected(peer, false);
    }
    super.channelInactive(ctx);
  }

  /** Bytes the peer has not read of what was sent on the connection; -1 when the kernel did not say. */
  private static int unread(ChannelHandlerContext ctx) {
    if (!(ctx.channel() instanceof EpollDomainSocketChannel socket) || !socket.isOpen()) {
      return -1;
    }
    try {
      return UnixSockets.queuedForPeer(socket.fd().intValue());
    } catch (IOException | LinkageError | RuntimeException e) {
      return -1; // the kernel did not say: assume the worst
    }
  }
}
