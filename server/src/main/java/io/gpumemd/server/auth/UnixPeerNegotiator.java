package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.netty.shaded.io.grpc.netty.GrpcHttp2ConnectionHandler;
import io.grpc.netty.shaded.io.grpc.netty.InternalNettyServerCredentials;
import io.grpc.netty.shaded.io.grpc.netty.InternalProtocolNegotiationEvent;
import io.grpc.netty.shaded.io.grpc.netty.InternalProtocolNegotiator;
import io.grpc.netty.shaded.io.grpc.netty.InternalProtocolNegotiators;
import io.grpc.netty.shaded.io.grpc.netty.ProtocolNegotiationEvent;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandler;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelInboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.PeerCredentials;
import io.grpc.netty.shaded.io.netty.util.AsciiString;
import io.grpc.ServerCredentials;
import java.io.IOException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Plaintext negotiation for the Unix socket that also asks the kernel who connected
 * (SO_PEERCRED: uid, gid, pid, fixed when the client called {@code connect}) and puts the
 * resulting {@link Caller} on the connection as {@link Callers#PEER}.
 *
 * <p>grpc-java has no public hook for this (grpc-java#2646: the Netty channel is not visible
 * to interceptors), so this uses its {@code Internal*} negotiation API: the same handler chain
 * as {@code serverPlaintext()} (wait until active, then hand over to gRPC) with one step in
 * between that adds the attribute. A peer whose credentials cannot be read is disconnected.
 *
 * <p>Thread-safety: stateless; handlers run on the connection's event loop.
 */
public final class UnixPeerNegotiator implements InternalProtocolNegotiator.ProtocolNegotiator {
  private static final Logger log = LoggerFactory.getLogger(UnixPeerNegotiator.class);
  private static final AsciiString SCHEME = AsciiString.of("http");

  private final IdentityPolicy policy;

  private UnixPeerNegotiator(IdentityPolicy policy) {
    this.policy = policy;
  }

  /** Server credentials for {@code NettyServerBuilder.forAddress(unixAddress, credentials)}. */
  public static ServerCredentials credentials(IdentityPolicy policy) {
    return InternalNettyServerCredentials.create(new UnixPeerNegotiator(policy));
  }

  @Override
  public AsciiString scheme() {
    return SCHEME;
  }

  @Override
  public ChannelHandler newHandler(GrpcHttp2ConnectionHandler grpcHandler) {
    ChannelHandler handOver = InternalProtocolNegotiators.grpcNegotiationHandler(grpcHandler);
    return InternalProtocolNegotiators.waitUntilActiveHandler(new PeerStep(handOver), grpcHandler.getNegotiationLogger());
  }

  @Override
  public void close() {}

  /** Reads the peer's credentials when negotiation reaches it, then steps aside. */
  private final class PeerStep extends ChannelInboundHandlerAdapter {
    private final ChannelHandler next;

    PeerStep(ChannelHandler next) {
      this.next = next;
    }

    @Override
    public void userEventTriggered(ChannelHandlerContext ctx, Object event) throws Exception {
      if (!(event instanceof ProtocolNegotiationEvent negotiation)) {
        super.userEventTriggered(ctx, event);
        return;
      }
      Caller caller;
      try {
        PeerCredentials creds = ((EpollDomainSocketChannel) ctx.channel()).peerCredentials();
        caller = policy.unixPeer(creds.uid(), creds.gids().length > 0 ? creds.gids()[0] : Caller.UNKNOWN, creds.pid());
      } catch (IOException | ClassCastException e) {
        log.warn("Closing a Unix-socket connection whose peer credentials cannot be read: {}", e.toString());
        ctx.close();
        return;
      }
      log.debug("Unix-socket connection from {}", caller);
      Attributes attributes = InternalProtocolNegotiationEvent.getAttributes(negotiation).toBuilder()
          .set(Callers.PEER, caller).build();
      ctx.pipeline().replace(ctx.name(), null, next);
      ctx.fireUserEventTriggered(InternalProtocolNegotiationEvent.withAttributes(negotiation, attributes));
    }
  }
}
