package io.gpumemd.server.testing;

import io.grpc.ManagedChannel;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import java.util.concurrent.TimeUnit;

/** A plaintext gRPC channel to a test daemon's Unix socket or loopback TCP port, with its own event loop. */
public final class TestChannel implements AutoCloseable {
  private final ManagedChannel channel;
  private final EventLoopGroup group = new EpollEventLoopGroup(1);

  /** @param target {@code unix:///path} or {@code host:port} */
  public TestChannel(String target) {
    NettyChannelBuilder builder;
    if (target.startsWith("unix://")) {
      builder = NettyChannelBuilder.forAddress(new DomainSocketAddress(target.substring("unix://".length())))
          .channelType(EpollDomainSocketChannel.class)
          .withOption(ChannelOption.SO_KEEPALIVE, null);
    } else {
      builder = NettyChannelBuilder.forTarget(target).channelType(EpollSocketChannel.class);
    }
    channel = builder.eventLoopGroup(group).usePlaintext().maxInboundMessageSize(64 << 20).build();
  }

  public ManagedChannel channel() {
    return channel;
  }

  @Override
  public void close() {
    channel.shutdownNow();
    try {
      channel.awaitTermination(2, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
  }
}
