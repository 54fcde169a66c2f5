package io.gpumemd.server.fd;

import io.gpumemd.common.unix.UnixSockets;
import io.grpc.netty.shaded.io.netty.channel.ChannelDuplexHandler;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelPromise;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.socket.ChannelInputShutdownEvent;
import io.gpumemd.server.auth.Caller;
import java.io.IOException;

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
 * <p>The channel runs with half-closure allowed, so that a peer's end of input reaches this
 * handler (which closes the connection) instead of closing the socket unseen. First in the
 * pipeline: every close on the way to the socket passes it.
 *
 * <p>Thread-safety: runs on the connection's event loop.
 */
final class ConnectionEnd extends ChannelDuplexHandler {
  private final DescriptorPins pins;
  private final Caller peer;
  private boolean ended;

  ConnectionEnd(DescriptorPins pins, Caller peer) {
    this.pins = pins;
    this.peer = peer;
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
    if (!ended) {
      ended = true;
      pins.disconnected(peer, nothingUnread(ctx));
    }
    super.close(ctx, promise);
  }

  @Override
  public void channelInactive(ChannelHandlerContext ctx) throws Exception {
    if (!ended) {
      ended = true; // closed under this handler: nobody asked the kernel, so assume the worst
      pins.disconnected(peer, false);
    }
    super.channelInactive(ctx);
  }

  private static boolean nothingUnread(ChannelHandlerContext ctx) {
    if (!(ctx.channel() instanceof EpollDomainSocketChannel socket) || !socket.isOpen()) {
      return false;
    }
    try {
      return UnixSockets.queuedForPeer(socket.fd().intValue()) == 0;
    } catch (IOException | LinkageError | RuntimeException e) {
      return false; // the kernel did not say: assume the worst
    }
  }
}
