package io.gpumemd.server;

import io.gpumemd.server.auth.AuthInterceptor;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.auth.LoopbackPeers;
import io.gpumemd.server.auth.UnixPeerNegotiator;
import io.gpumemd.server.metrics.MetricsHttpServer;
import io.grpc.Server;
import io.grpc.ServerServiceDefinition;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.net.BindException;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The daemon's listeners: gRPC on a Unix domain socket and/or TCP (sharing one pair of epoll
 * event-loop groups), and the Prometheus endpoint. Owns the socket file from the moment it
 * binds it, and removes it at {@link #close}. A listener that cannot bind fails the start with
 * a message naming the listener and the address ({@code tcp listener: 127.0.0.1:50051 already
 * in use}).
 *
 * <p>Started and closed by one thread ({@link GpumemdServer}); the accessors may be read from
 * any thread once started.
 */
final class Listeners implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(Listeners.class);

  private final List<ServerServiceDefinition> services;
  private final IdentityPolicy identities;
  private final EventLoopGroup bossGroup = new EpollEventLoopGroup(1, daemonThreads("gpumemd-accept"));
  private final EventLoopGroup workerGroup =
      new EpollEventLoopGroup(Math.max(2, Runtime.getRuntime().availableProcessors()), daemonThreads("gpumemd-io"));
  private final List<Server> servers = new ArrayList<>();
  private MetricsHttpServer metrics;
  private Path socketPath;
  private int tcpPort = -1;

  /**
   * @param identities how peers become callers: the Unix socket asks the kernel (SO_PEERCRED),
   *     TCP looks up loopback peers' socket owners
   */
  Listeners(List<ServerServiceDefinition> services, IdentityPolicy identities) {
    this.services = services;
    this.identities = identities;
  }

  static ThreadFactory daemonThreads(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  /**
   * Listens on a Unix socket.
   *
   * @param mode its permissions as {@code rwxrwxrwx} text (who may connect at all)
   */
  void startUnix(Path path, String mode) throws IOException {
    Path absolute = path.toAbsolutePath();
    prepareSocketPath(absolute);
    Server uds = bind("unix listener", "unix://" + absolute,
        NettyServerBuilder.forAddress(new DomainSocketAddress(absolute.toString()),
                UnixPeerNegotiator.credentials(identities))
            .channelType(EpollServerDomainSocketChannel.class));
    socketPath = absolute; // ours from now on: removed at close
    Files.setPosixFilePermissions(socketPath, PosixFilePermissions.fromString(mode));
    log.info("Listening on unix://{} (mode {})", socketPath, mode);
  }

  void startTcp(String host, int port) throws IOException {
    Server tcp = bind("tcp listener", host + ":" + port,
        NettyServerBuilder.forAddress(new InetSocketAddress(host, port)).channelType(EpollServerSocketChannel.class)
            .addTransportFilter(new LoopbackPeers(identities)));
    tcpPort = ((InetSocketAddress) tcp.getListenSockets().get(0)).getPort();
    log.info("Listening on tcp://{}:{}", host, tcpPort);
  }

  void startMetrics(String host, int port, PrometheusMeterRegistry registry, Runnable beforeScrape) throws IOException {
    try {
      metrics = new MetricsHttpServer(host, port, registry, beforeScrape);
    } catch (BindException e) {
      throw new IOException("metrics listener: " + host + ":" + port + " already in use", e);
    }
    log.info("Metrics on http://{}:{}/metrics", host, metrics.port());
  }

  private Server bind(String listener, String address, NettyServerBuilder builder) throws IOException {
    builder.bossEventLoopGroup(bossGroup)
        .workerEventLoopGroup(workerGroup)
        // Handlers never block: a lease that needs the backend moves itself to the blocking
        // executor (AllocatorService). Running on the transport thread saves a thread hop.
        .directExecutor()
        // Pings find clients that vanished without closing their connection (a crashed host
        // on TCP), so their sessions end instead of living forever on a dead stream.
        .keepAliveTime(30, TimeUnit.SECONDS)
        .keepAliveTimeout(10, TimeUnit.SECONDS)
        .permitKeepAliveTime(10, TimeUnit.SECONDS)
        .permitKeepAliveWithoutCalls(true);
    services.forEach(builder::addService);
    // Every call learns who is calling before any handler runs (Callers.current()).
    builder.intercept(new AuthInterceptor());
    Server server = builder.build();
    try {
      server.start();
    } catch (IOException e) {
      throw new IOException(listener + ": " + address + (isAddressInUse(e) ? " already in use" : ": " + e.getMessage()), e);
    }
    servers.add(server);
    return server;
  }

  private static boolean isAddressInUse(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof BindException || String.valueOf(t.getMessage()).contains("Address already in use")) {
        return true;
      }
    }
    return false;
  }

  /** Removes a stale socket file, refusing if a live daemon still answers on it. */
  private static void prepareSocketPath(Path path) throws IOException {
    Files.createDirectories(path.getParent());
    if (!Files.exists(path)) {
      return;
    }
    boolean live;
    try (SocketChannel probe = SocketChannel.open(StandardProtocolFamily.UNIX)) {
      live = probe.connect(UnixDomainSocketAddress.of(path));
    } catch (IOException e) {
      live = false; // nobody listens: left by a daemon that died
    }
    if (live) {
      throw new IOException("unix listener: " + path + " is in use by a running process (expected: a free path)");
    }
    Files.delete(path);
  }

  Path socketPath() {
    return socketPath;
  }

  int tcpPort() {
    return tcpPort;
  }

  int metricsPort() {
    return metrics == null ? -1 : metrics.port();
  }

  /** Stops taking calls and waits briefly for running ones; the socket file goes. */
  @Override
  public void close() {
    for (Server server : servers) {
      server.shutdown();
    }
    for (Server server : servers) {
      try {
        if (!server.awaitTermination(2, TimeUnit.SECONDS)) {
          server.shutdownNow();
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        server.shutdownNow();
      }
    }
    if (metrics != null) {
      metrics.close();
    }
    bossGroup.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    workerGroup.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    if (socketPath != null) {
      try {
        Files.deleteIfExists(socketPath);
      } catch (IOException e) {
        log.warn("Cannot remove socket {}: {}", socketPath, e.toString());
      }
    }
  }
}
