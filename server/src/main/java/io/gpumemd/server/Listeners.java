package io.gpumemd.server;

import io.gpumemd.server.auth.AuthInterceptor;
import io.gpumemd.server.auth.CertificatePeers;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.auth.LoopbackPeers;
import io.gpumemd.server.auth.UnixAccounts;
import io.gpumemd.server.auth.UnixPeerNegotiator;
import io.gpumemd.server.config.TcpSecurityConfig;
import io.gpumemd.server.config.TransportLimits;
import io.gpumemd.server.fd.FdChannel;
import io.gpumemd.server.metrics.MetricsHttpServer;
import io.gpumemd.server.metrics.ReadinessCheck;
import io.gpumemd.server.takeover.HandOverGate;
import io.gpumemd.server.takeover.HandOverInterceptor;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.ServerCredentials;
import io.grpc.ServerServiceDefinition;
import io.grpc.TlsServerCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollChannelOption;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.net.BindException;
import java.net.InetSocketAddress;
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
 * event-loop groups), the fd channel's socket ({@link FdChannel}) and the Prometheus endpoint.
 * Owns each socket file from the moment it binds it, and removes it at {@link #close} (their
 * paths are {@link SocketFiles}' job). A
 * listener that cannot bind fails the start with a message naming the listener and the address
 * ({@code tcp listener: 127.0.0.1:50051 already in use}).
 *
 * <p>Trust: the Unix socket is plaintext and identifies peers by SO_PEERCRED, never TLS. TCP is
 * TLS when configured (with client certificates under mutual TLS, {@link CertificatePeers}),
 * and identifies loopback peers by their socket's owner ({@link LoopbackPeers}); on every
 * listener {@link AuthInterceptor} lets a bearer token decide the caller instead.
 *
 * <p>Started and closed by one thread ({@link GpumemdServer}); the accessors may be read from
 * any thread once started.
 */
final class Listeners implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(Listeners.class);

  private final List<ServerServiceDefinition> services;
  private final IdentityPolicy identities;
  private final AuthInterceptor auth;
  private final HandOverInterceptor handOver;
  private final TransportLimits limits;
  /**
   * One accept thread and one set of I/O threads per listener: a flood of TCP connects never
   * delays the socket's accepts nor its calls. With one shared set, setting up a storm of 1,000
   * TCP connections queued ahead of the socket's calls on the same event loops held a health
   * check over the socket for about 300 ms (AbuseMain).
   */
  private final List<EventLoopGroup> eventLoopGroups = new ArrayList<>();
  private final List<Server> servers = new ArrayList<>();
  /** The Unix listener's accept and I/O event loops, once bound: a rehearsal's scratch server runs on them too. */
  private EventLoopGroup[] unixGroups;
  private MetricsHttpServer metrics;
  private Path socketPath;
  private FdChannel fdChannel;
  private Path fdSocketPath;
  private int tcpPort = -1;
  /** Where the socket files are, and whose. */
  private final SocketFiles files = new SocketFiles();

  /**
   * @param identities how peers become callers: the Unix socket asks the kernel (SO_PEERCRED),
   *     TCP looks up loopback peers' socket owners
   * @param auth decides each call's caller (bearer tokens, the connection's peer, anonymous)
   */
  Listeners(List<ServerServiceDefinition> services, IdentityPolicy identities, AuthInterceptor auth,
      HandOverInterceptor handOver, TransportLimits limits) {
    this.services = services;
    this.handOver = handOver;
    this.identities = identities;
    this.auth = auth;
    this.limits = limits;
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
   * @param group its group (name or gid), or empty to leave the daemon's
   */
  void startUnix(Path path, String mode, String group) throws IOException {
    int gid = socketGid("unix listener", group);
    Path absolute = path.toAbsolutePath();
    Path at = files.bindPath(absolute, "unix listener", "--socket");
    Server uds = bind("unix listener", "unix://" + at,
        NettyServerBuilder.forAddress(new DomainSocketAddress(at.toString()),
                ConnectionLimit.wrap(UnixPeerNegotiator.credentials(identities), "unix listener",
                    "--unix-max-connections", limits.unixMaxConnections()))
            .channelType(EpollServerDomainSocketChannel.class), "unix");
    restrictSocket(at, mode, gid);
    socketPath = absolute;
    files.owned("socket", at, absolute);
    log.info("Listening on unix://{} (mode {}{})", socketPath, mode, gid >= 0 ? ", group " + gid : "");
  }

  /**
   * Serves the fd channel on its own socket, with the gRPC socket's mode and group: who may
   * connect at all. Who gets a descriptor is decided per request ({@link FdChannel}).
   */
  void startFd(Path path, String mode, String group, FdChannel channel) throws IOException {
    int gid = socketGid("fd listener", group);
    Path absolute = path.toAbsolutePath();
    Path at = files.bindPath(absolute, "fd listener", "--fd-socket");
    fdChannel = channel;
    channel.bind(at);
    restrictSocket(at, mode, gid);
    fdSocketPath = absolute;
    files.owned("fd socket", at, absolute);
    log.info("fd channel on unix://{} (mode {}{}): segments are passed as file descriptors", fdSocketPath, mode,
        gid >= 0 ? ", group " + gid : "");
  }

  /** A socket's group as a gid, or -1 to leave the daemon's. */
  private static int socketGid(String listener, String group) throws IOException {
    int gid = group.isEmpty() ? -1 : UnixAccounts.gidOf(group);
    if (!group.isEmpty() && gid < 0) {
      throw new IOException(listener + ": socket group '" + group + "' is not a group on this host "
          + "(expected: a name from /etc/group or a numeric gid)");
    }
    return gid;
  }

  private static void restrictSocket(Path socket, String mode, int gid) throws IOException {
    Files.setPosixFilePermissions(socket, PosixFilePermissions.fromString(mode));
    if (gid >= 0) {
      Files.setAttribute(socket, "unix:gid", gid);
    }
  }

  /**
   * Listens on TCP, with TLS when {@code security} has a certificate. A peer's certificate
   * (mutual TLS) identifies it before its socket's owner does: it is what the client chose to
   * present.
   */
  void startTcp(String host, int port, TcpSecurityConfig security) throws IOException {
    InetSocketAddress address = new InetSocketAddress(host, port);
    ServerCredentials credentials = security.tls() ? tlsCredentials(security) : InsecureServerCredentials.create();
    NettyServerBuilder builder = NettyServerBuilder.forAddress(address,
        ConnectionLimit.wrap(credentials, "tcp listener", "--tcp-max-connections", limits.tcpMaxConnections()));
    builder.channelType(EpollServerSocketChannel.class);
    // SO_REUSEPORT lets a successor (--take-over) bind the same port while this daemon still
    // listens, so no connection is refused during a hand-over. It would also let a second
    // daemon of the same uid share the port by mistake: a fresh start checks that nobody
    // answers there first.
    if (!files.takingOverNow() && port != 0) {
      refuseIfAnswering(address);
    }
    builder.withOption(EpollChannelOption.SO_REUSEPORT, true);
    if (security.mutualTls()) {
      builder.addTransportFilter(new CertificatePeers(security.adminCertCommonNames()));
    }
    builder.addTransportFilter(new LoopbackPeers(identities));
    Server tcp = bind("tcp listener", host + ":" + port, builder, "tcp");
    tcpPort = ((InetSocketAddress) tcp.getListenSockets().get(0)).getPort();
    log.info("Listening on tcp://{}:{} ({})", host, tcpPort, security.describe());
    if (security.insecureTcp() && !security.tls()) {
      log.warn("--insecure-tcp: TCP on {}:{} is plaintext and open to other hosts. Peers there are not identified "
          + "unless they send a bearer token: all of them share the tenant 'anonymous', so each can lease memory "
          + "(within that tenant's quota), list, use and end the others' sessions and leases, and anyone on the "
          + "network path can read and alter the traffic. None of them can use the admin verbs. Prefer "
          + "--tls-cert/--tls-key (with --tls-client-ca or --tokens-file).", host, tcpPort);
    }
  }

  private static void refuseIfAnswering(InetSocketAddress address) throws IOException {
    try (java.net.Socket probe = new java.net.Socket()) {
      probe.connect(address.isUnresolved() ? address : new InetSocketAddress(
          address.getAddress().isAnyLocalAddress() ? java.net.InetAddress.getLoopbackAddress() : address.getAddress(),
          address.getPort()), 500);
    } catch (IOException e) {
      return; // nobody answers: free
    }
    throw new IOException("tcp listener: " + address.getHostString() + ":" + address.getPort() + " already in use");
  }

  private static ServerCredentials tlsCredentials(TcpSecurityConfig security) throws IOException {
    try {
      TlsServerCredentials.Builder tls = TlsServerCredentials.newBuilder()
          .keyManager(security.tlsCert().toFile(), security.tlsKey().toFile());
      if (security.mutualTls()) {
        tls.trustManager(security.tlsClientCa().toFile()).clientAuth(TlsServerCredentials.ClientAuth.REQUIRE);
      }
      return tls.build();
    } catch (IOException e) {
      // checked when the configuration was parsed: only a file changed since then gets here
      throw new IOException("tcp listener: cannot read the TLS files: " + e.getMessage(), e);
    }
  }

  void startMetrics(String host, int port, PrometheusMeterRegistry registry, Runnable beforeScrape,
      ReadinessCheck readiness, long metricsRetryMillis) throws IOException {
    // A successor binds the port its predecessor is about to close: it retries for a while.
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(metricsRetryMillis);
    while (true) {
      try {
        metrics = new MetricsHttpServer(host, port, registry, beforeScrape, readiness);
        break;
      } catch (BindException e) {
        if (System.nanoTime() >= deadline) {
          throw new IOException("metrics listener: " + host + ":" + port + " already in use", e);
        }
        try {
          Thread.sleep(50);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          throw new IOException("metrics listener: interrupted", ie);
        }
      }
    }
    log.info("Metrics on http://{}:{}/metrics (probes: /healthz, /readyz)", host, metrics.port());
  }

  /** @param kind names the listener's threads: gpumemd-accept-KIND-1, gpumemd-io-KIND-N */
  private Server bind(String listener, String address, NettyServerBuilder builder, String kind)
      throws IOException {
    EventLoopGroup bossGroup = new EpollEventLoopGroup(1, daemonThreads("gpumemd-accept-" + kind));
    EventLoopGroup workerGroup = new EpollEventLoopGroup(Math.max(2, Runtime.getRuntime().availableProcessors()),
        daemonThreads("gpumemd-io-" + kind));
    eventLoopGroups.add(bossGroup);
    eventLoopGroups.add(workerGroup);
    if (kind.equals("unix")) {
      unixGroups = new EventLoopGroup[] {bossGroup, workerGroup};
    }
    Server server = configure(builder, bossGroup, workerGroup, services, handOver).build();
    try {
      server.start();
    } catch (IOException e) {
      throw new IOException(listener + ": " + address
          + (isAddressInUse(e) ? " already in use" : ": " + e.getMessage()), e);
    }
    servers.add(server);
    return server;
  }

  /**
   * A server like the Unix listener, on its event loops, over {@code scratchServices} with an
   * open gate, bound at {@code at}: what a successor's {@link io.gpumemd.server.takeover.Rehearsal}
   * serves its scratch books on, on a path no client knows. Neither published nor logged; closing
   * it stops it as {@link #stopAccepting} does (not the event loops) and removes its socket file.
   *
   * @throws IOException when there is no Unix listener, or {@code at} cannot be bound
   */
  AutoCloseable scratchUnix(List<ServerServiceDefinition> scratchServices, Path at) throws IOException {
    EventLoopGroup[] groups = unixGroups;
    if (groups == null) {
      throw new IOException("no unix listener to rehearse on");
    }
    Files.deleteIfExists(at);
    Server server = configure(NettyServerBuilder.forAddress(new DomainSocketAddress(at.toString()),
                ConnectionLimit.wrap(UnixPeerNegotiator.credentials(identities), "rehearsal listener",
                    "--unix-max-connections", limits.unixMaxConnections()))
            .channelType(EpollServerDomainSocketChannel.class),
        groups[0], groups[1], scratchServices, new HandOverInterceptor(HandOverGate.ALWAYS_OPEN)).build().start();
    restrictSocket(at, "rw-------", -1);
    return () -> {
      // As a daemon that handed over stops: connections are sent away (GOAWAY), not cut.
      server.shutdown();
      if (!server.awaitTermination(1, TimeUnit.SECONDS)) {
        server.shutdownNow();
      }
      Files.deleteIfExists(at);
    };
  }

  /** The settings every listener's server has, on {@code boss} and {@code workers}. */
  private NettyServerBuilder configure(NettyServerBuilder builder, EventLoopGroup boss, EventLoopGroup workers,
      List<ServerServiceDefinition> served, HandOverInterceptor gate) {
    builder.bossEventLoopGroup(boss)
        .workerEventLoopGroup(workers)
        // Handlers never block: a lease that needs the backend moves itself to the blocking
        // executor (AllocatorService). Running on the transport thread saves a thread hop.
        .directExecutor()
        // Pings find clients that vanished without closing their connection (a crashed host
        // on TCP), so their sessions end instead of living forever on a dead stream.
        .keepAliveTime(30, TimeUnit.SECONDS)
        .keepAliveTimeout(10, TimeUnit.SECONDS)
        .permitKeepAliveTime(10, TimeUnit.SECONDS)
        .permitKeepAliveWithoutCalls(true)
        // What one peer can make the transport hold (TransportLimits). A connection that has
        // not finished its handshake and HTTP/2 preface in 20 s is closed: a peer that
        // connects and sends nothing holds a descriptor only that long.
        .maxInboundMessageSize(limits.maxMessageBytes())
        .maxInboundMetadataSize(64 << 10)
        .maxConcurrentCallsPerConnection(limits.maxCallsPerConnection())
        .handshakeTimeout(20, TimeUnit.SECONDS);
    if (limits.connectionIdleSeconds() > 0) {
      builder.maxConnectionIdle(limits.connectionIdleSeconds(), TimeUnit.SECONDS);
    }
    served.forEach(builder::addService);
    // Every call learns who is calling before any handler runs (Callers.current()).
    builder.intercept(auth);
    // While a successor takes over, calls are refused unserved (UNAVAILABLE, gpumemd-moving).
    builder.intercept(gate);
    return builder;
  }

  private static boolean isAddressInUse(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof BindException || String.valueOf(t.getMessage()).contains("Address already in use")) {
        return true;
      }
    }
    return false;
  }

  Path socketPath() {
    return socketPath;
  }

  /** Where the Unix socket is bound now: its temporary path until {@link #publish}; null without one. */
  Path unixBoundAt() {
    Path at = files.pendingAt("socket");
    return at == null ? socketPath : at;
  }

  /** See {@link SocketFiles#publish}: clients can connect only from here on. */
  void publish() throws IOException {
    files.publish();
  }

  /** The sockets are a successor's: their paths are a live predecessor's until {@link #publish}. */
  void takingOver() {
    files.takingOver();
  }

  /** Nobody answered on the take-over socket after all: {@link #publish} replaces only stale sockets. */
  void noPredecessor() {
    files.noPredecessor();
  }

  /** Null while every socket file is still at its path; else which one is gone or replaced. */
  String socketProblem() {
    return files.socketProblem();
  }

  Path fdSocketPath() {
    return fdSocketPath;
  }

  FdChannel fdChannel() {
    return fdChannel;
  }

  int tcpPort() {
    return tcpPort;
  }

  int metricsPort() {
    return metrics == null ? -1 : metrics.port();
  }

  /**
   * The gRPC listeners stop taking connections and new calls and tell their connections so
   * (GOAWAY): the clients' next calls open connections to the successor. Idempotent.
   */
  void sendAway() {
    for (Server server : servers) {
      server.shutdown();
    }
  }

  /**
   * Stops taking connections and new calls (calls running go on): what a daemon that handed over
   * does first, so that its clients' next calls open connections to the successor.
   */
  void stopAccepting() {
    sendAway();
    if (fdChannel != null) {
      fdChannel.close();
    }
  }

  /**
   * Stops taking calls and waits briefly for running ones; the socket files go, unless a
   * successor has replaced them with its own.
   */
  @Override
  public void close() {
    stopAccepting();
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
    eventLoopGroups.forEach(g -> g.shutdownGracefully(0, 1, TimeUnit.SECONDS));
    files.removeAll();
  }


}
