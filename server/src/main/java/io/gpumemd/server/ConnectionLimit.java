package io.gpumemd.server;

import io.grpc.ServerCredentials;
import io.grpc.internal.ObjectPool;
import io.grpc.netty.shaded.io.grpc.netty.GrpcHttp2ConnectionHandler;
import io.grpc.netty.shaded.io.grpc.netty.InternalNettyServerCredentials;
import io.grpc.netty.shaded.io.grpc.netty.InternalProtocolNegotiator;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandler;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelInboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.util.AsciiString;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A cap on the live connections of one listener. grpc-java has no such setting, and a
 * {@code ServerTransportFilter} hears of a connection only once its HTTP/2 preface arrived
 * (never, for a peer that connects and sends nothing) and cannot close it; so this wraps the
 * listener's protocol negotiation (grpc's {@code Internal*} API, as {@link
 * io.gpumemd.server.auth.UnixPeerNegotiator} does), which runs for every accepted connection
 * before anything is read from it. A connection beyond the cap is closed at once, so a flood
 * costs the daemon no file descriptors beyond the cap, and the other listener, counted apart,
 * keeps answering.
 *
 * <p>Refusals are logged as one WARN line a minute at most, with how many there were.
 *
 * <p>Thread-safety: the count is atomic; handlers run on their connection's event loop.
 */
final class ConnectionLimit {
  private static final Logger log = LoggerFactory.getLogger(ConnectionLimit.class);
  private static final long LOG_EVERY_NANOS = TimeUnit.MINUTES.toNanos(1);

  private final String listener;
  private final String flag;
  private final int max;
  private final AtomicInteger live = new AtomicInteger();
  private final AtomicLong refusedSinceLog = new AtomicLong();
  private final AtomicLong lastLogNanos = new AtomicLong(System.nanoTime() - LOG_EVERY_NANOS);

  private ConnectionLimit(String listener, String flag, int max) {
    this.listener = listener;
    this.flag = flag;
    this.max = max;
  }

  /**
   * The listener's credentials with a connection cap in front of their negotiation.
   *
   * @param max live connections allowed; 0 = no cap (the credentials are returned as they are)
   */
  static ServerCredentials wrap(ServerCredentials credentials, String listener, String flag, int max) {
    if (max <= 0) {
      return credentials;
    }
    ConnectionLimit limit = new ConnectionLimit(listener, flag, max);
    InternalProtocolNegotiator.ServerFactory inner = InternalNettyServerCredentials.toNegotiator(credentials);
    return InternalNettyServerCredentials.create(new InternalProtocolNegotiator.ServerFactory() {
      @Override
      public InternalProtocolNegotiator.ProtocolNegotiator newNegotiator(ObjectPool<? extends Executor> executors) {
        return limit.negotiator(inner.newNegotiator(executors));
      }
    });
  }

  private InternalProtocolNegotiator.ProtocolNegotiator negotiator(InternalProtocolNegotiator.ProtocolNegotiator inner) {
    return new InternalProtocolNegotiator.ProtocolNegotiator() {
      @Override
      public AsciiString scheme() {
        return inner.scheme();
      }

      @Override
      public ChannelHandler newHandler(GrpcHttp2ConnectionHandler grpcHandler) {
        return new Gate(inner.newHandler(grpcHandler));
      }

      @Override
      public void close() {
        inner.close();
      }
    };
  }

  int live() {
    return live.get();
  }

  private void refused() {
    refusedSinceLog.incrementAndGet();
    long now = System.nanoTime();
    long last = lastLogNanos.get();
    if (now - last >= LOG_EVERY_NANOS && lastLogNanos.compareAndSet(last, now)) {
      long count = refusedSinceLog.getAndSet(0);
      log.atWarn().addKeyValue("listener", listener).addKeyValue("refused_connections", count)
          .log("{}: {} live connections, the limit ({}); closed {} new connection(s) since the last such line",
          listener, max, flag, count);
    }
  }

  /** Counts the connection, or closes it when the listener is full; then steps aside. */
  private final class Gate extends ChannelInboundHandlerAdapter {
    private final ChannelHandler next;

    Gate(ChannelHandler next) {
      this.next = next;
    }

    @Override
    public void handlerAdded(ChannelHandlerContext ctx) {
      if (live.incrementAndGet() > max) {
        live.decrementAndGet();
        refused();
        ctx.close();
        return;
      }
      ctx.channel().closeFuture().addListener(f -> live.decrementAndGet());
      ctx.pipeline().replace(this, null, next);
    }
  }
}
