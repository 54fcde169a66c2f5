package io.gpumemd.server.metrics;

import io.grpc.netty.shaded.io.netty.bootstrap.ServerBootstrap;
import io.grpc.netty.shaded.io.netty.buffer.Unpooled;
import io.grpc.netty.shaded.io.netty.channel.Channel;
import io.grpc.netty.shaded.io.netty.channel.ChannelFutureListener;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelInitializer;
import io.grpc.netty.shaded.io.netty.channel.SimpleChannelInboundHandler;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.socket.SocketChannel;
import io.grpc.netty.shaded.io.netty.handler.codec.http.DefaultFullHttpResponse;
import io.grpc.netty.shaded.io.netty.handler.codec.http.FullHttpRequest;
import io.grpc.netty.shaded.io.netty.handler.codec.http.FullHttpResponse;
import io.grpc.netty.shaded.io.netty.handler.codec.http.HttpHeaderNames;
import io.grpc.netty.shaded.io.netty.handler.codec.http.HttpMethod;
import io.grpc.netty.shaded.io.netty.handler.codec.http.HttpObjectAggregator;
import io.grpc.netty.shaded.io.netty.handler.codec.http.HttpResponseStatus;
import io.grpc.netty.shaded.io.netty.handler.codec.http.HttpServerCodec;
import io.grpc.netty.shaded.io.netty.handler.codec.http.HttpVersion;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.net.BindException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Serves {@code GET /metrics} in the Prometheus text format, and two probes for orchestrators:
 * {@code /healthz} (alive: 200 whenever this listener answers, which it does from the end of the
 * daemon's start until its listeners close after the drain) and {@code /readyz} (200 when the
 * {@link ReadinessCheck} finds nothing wrong, else 503 with its one-line reason). Anything else
 * is 404 (405 for methods other than GET and HEAD). The probes take no lock and scrape nothing,
 * so a kubelet probing every few seconds costs next to nothing (an exec probe running {@code
 * gpumemctl health} started a JVM each time: about half a CPU-second). Built on the Netty that
 * gRPC already ships, on one event-loop thread, so a client that sends half a request holds only
 * its own connection: every connection must finish its request within {@value
 * #REQUEST_DEADLINE_SECONDS} s, requests are bounded in size, and at most {@value
 * #MAX_CONNECTIONS} connections wait for their request at once: a new one closes the one that
 * has waited longest, so idle or trickling connections can delay a scrape or a probe by nothing
 * but a reconnect.
 * (The JDK's built-in server reads a request on its worker thread, so one half-sent request
 * stalled every scrape until the client gave up.) A scrape that fails is answered 500, its cause
 * logged at WARN once; a single failing meter does not fail it (see {@link
 * IsolatingPrometheusRegistry}).
 *
 * <p>Thread-safety: started and closed by one thread; connections are served on the event loop.
 */
public final class MetricsHttpServer implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(MetricsHttpServer.class);
  static final int REQUEST_DEADLINE_SECONDS = 5;
  static final int MAX_CONNECTIONS = 32;
  private static final int MAX_REQUEST_BYTES = 8192;

  private final EpollEventLoopGroup group = new EpollEventLoopGroup(1, r -> {
    Thread t = new Thread(r, "gpumemd-metrics");
    t.setDaemon(true);
    return t;
  });
  private final Channel channel;
  /** Connections that have not sent a whole request yet, oldest first; event-loop thread only. */
  private final ArrayDeque<Channel> waiting = new ArrayDeque<>();
  /** Whether a failed scrape was logged at WARN yet: once per server, later ones at DEBUG. */
  private final AtomicBoolean scrapeFailureLogged = new AtomicBoolean();

  /**
   * @param beforeScrape runs on the metrics thread before each scrape (takes the snapshot the
   *     pool meters read)
   * @param readiness what {@code /readyz} reports
   * @throws BindException when the address is taken
   * @throws IOException when it cannot be bound for another reason
   */
  public MetricsHttpServer(String host, int port, PrometheusMeterRegistry registry, Runnable beforeScrape,
      ReadinessCheck readiness) throws IOException {
    ServerBootstrap bootstrap = new ServerBootstrap().group(group).channel(EpollServerSocketChannel.class)
        .childHandler(new ChannelInitializer<SocketChannel>() {
          @Override
          protected void initChannel(SocketChannel ch) {
            // One event-loop thread serves the listener and every connection: no locking needed.
            waiting.addLast(ch);
            ch.closeFuture().addListener(f -> waiting.remove(ch));
            if (waiting.size() > MAX_CONNECTIONS) {
              waiting.pollFirst().close();
            }
            // A connection that has not sent a whole request by then is dropped, however slowly
            // it trickles bytes in: a read timeout alone would not stop a slowloris.
            ch.eventLoop().schedule(() -> ch.close(), REQUEST_DEADLINE_SECONDS, TimeUnit.SECONDS);
            ch.pipeline().addLast(new HttpServerCodec(4096, MAX_REQUEST_BYTES, MAX_REQUEST_BYTES),
                new HttpObjectAggregator(MAX_REQUEST_BYTES),
                new Endpoints(registry, beforeScrape, readiness, waiting, scrapeFailureLogged));
          }
        });
    try {
      channel = bootstrap.bind(new InetSocketAddress(host, port)).syncUninterruptibly().channel();
    } catch (Exception e) { // Netty rethrows the bind's IOException unchecked
      group.shutdownGracefully(0, 0, TimeUnit.SECONDS);
      if (e instanceof BindException || e.getCause() instanceof BindException
          || String.valueOf(e.getMessage()).contains("Address already in use")) {
        throw new BindException(host + ":" + port + " already in use");
      }
      throw new IOException("metrics listener: " + host + ":" + port + ": " + e.getMessage(), e);
    }
  }

  public int port() {
    return ((InetSocketAddress) channel.localAddress()).getPort();
  }

  @Override
  public void close() {
    channel.close().syncUninterruptibly();
    group.shutdownGracefully(0, 1, TimeUnit.SECONDS).syncUninterruptibly();
  }

  /**
   * Answers one request and closes the connection (scrapes and probes are rare; no keep-alive
   * to bound).
   */
  private static final class Endpoints extends SimpleChannelInboundHandler<FullHttpRequest> {
    private static final String TEXT = "text/plain; charset=utf-8";
    private final PrometheusMeterRegistry registry;
    private final Runnable beforeScrape;
    private final ReadinessCheck readiness;
    private final ArrayDeque<Channel> waiting;
    private final AtomicBoolean scrapeFailureLogged;

    Endpoints(PrometheusMeterRegistry registry, Runnable beforeScrape, ReadinessCheck readiness,
        ArrayDeque<Channel> waiting, AtomicBoolean scrapeFailureLogged) {
      this.registry = registry;
      this.beforeScrape = beforeScrape;
      this.readiness = readiness;
      this.waiting = waiting;
      this.scrapeFailureLogged = scrapeFailureLogged;
    }

    @Override
    protected void channelRead0(ChannelHandlerContext ctx, FullHttpRequest request) {
      waiting.remove(ctx.channel()); // has its request: no longer one to displace
      if (!request.decoderResult().isSuccess()) {
        respond(ctx, HttpResponseStatus.BAD_REQUEST, "bad request\n", TEXT);
        return;
      }
      String path;
      try {
        path = URI.create(request.uri().startsWith("/") ? request.uri() : "/").getPath();
      } catch (IllegalArgumentException e) {
        respond(ctx, HttpResponseStatus.BAD_REQUEST, "bad request: malformed path\n", TEXT);
        return;
      }
      if (!request.method().equals(HttpMethod.GET) && !request.method().equals(HttpMethod.HEAD)) {
        respond(ctx, HttpResponseStatus.METHOD_NOT_ALLOWED, "GET /metrics, /healthz or /readyz\n", TEXT);
        return;
      }
      switch (String.valueOf(path)) {
        case "/metrics" -> scrape(ctx);
        case "/healthz" -> respond(ctx, HttpResponseStatus.OK, "ok\n", TEXT);
        case "/readyz" -> ready(ctx);
        default -> respond(ctx, HttpResponseStatus.NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n", TEXT);
      }
    }

    private void ready(ChannelHandlerContext ctx) {
      String problem;
      try {
        problem = readiness.problem();
      } catch (RuntimeException e) {
        // Not ready is the safe answer: the kubelet takes the pod out of endpoints, nothing dies.
        log.debug("Readiness check failed: {}", e.toString());
        problem = "readiness check failed: " + e;
      }
      if (problem == null) {
        respond(ctx, HttpResponseStatus.OK, "ready\n", TEXT);
      } else {
        respond(ctx, HttpResponseStatus.SERVICE_UNAVAILABLE, problem.replace('\n', ' ') + "\n", TEXT);
      }
    }

    private void scrape(ChannelHandlerContext ctx) {
      String text;
      try {
        beforeScrape.run();
        text = registry.scrape();
      } catch (RuntimeException e) {
        // A failing meter is left out by IsolatingPrometheusRegistry; this is anything else.
        // Prometheus is told (500, not a closed connection), the cause is logged once.
        if (scrapeFailureLogged.compareAndSet(false, true)) {
          log.warn("Metrics scrape failed; answering 500 while it fails", e);
        } else {
          log.debug("Metrics scrape failed again: {}", e.toString());
        }
        respond(ctx, HttpResponseStatus.INTERNAL_SERVER_ERROR, "scrape failed: see the daemon's log\n", TEXT);
        return;
      }
      respond(ctx, HttpResponseStatus.OK, text, "text/plain; version=0.0.4; charset=utf-8");
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
      // A peer that resets or sends garbage: its connection goes; nothing to log at INFO.
      log.debug("Metrics connection from {} closed: {}", ctx.channel().remoteAddress(), cause.toString());
      ctx.close();
    }

    private static void respond(ChannelHandlerContext ctx, HttpResponseStatus status, String body, String type) {
      byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
      FullHttpResponse response = new DefaultFullHttpResponse(HttpVersion.HTTP_1_1, status, Unpooled.wrappedBuffer(bytes));
      response.headers().set(HttpHeaderNames.CONTENT_TYPE, type)
          .setInt(HttpHeaderNames.CONTENT_LENGTH, bytes.length)
          .set(HttpHeaderNames.CONNECTION, "close");
      ctx.writeAndFlush(response).addListener(ChannelFutureListener.CLOSE);
    }
  }
}
