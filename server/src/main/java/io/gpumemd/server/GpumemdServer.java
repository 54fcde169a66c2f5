package io.gpumemd.server;

import io.gpumemd.server.backend.BackendSelector;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.grpc.AdminService;
import io.gpumemd.server.grpc.AllocatorService;
import io.gpumemd.server.metrics.MetricsHttpServer;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.pool.SizeClasses;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.Ticker;
import io.grpc.ServerServiceDefinition;
import io.gpumemd.server.grpc.DocumentedSchema;
import io.grpc.Server;
import io.grpc.health.v1.HealthCheckResponse.ServingStatus;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.protobuf.services.HealthStatusManager;
import io.grpc.protobuf.services.ProtoReflectionService;
import io.grpc.protobuf.services.ProtoReflectionServiceV1;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The running daemon: wires the backend, pools, session registry, gRPC services (with health
 * and reflection), listeners and metrics, and takes them down in order on shutdown.
 *
 * <p>Owns every resource it starts. {@link #start} and {@link #shutdown} may be called from
 * any thread; shutdown runs once (later calls wait for it, or, with {@code force}, cut the
 * drain short).
 */
public final class GpumemdServer {
  private static final Logger log = LoggerFactory.getLogger(GpumemdServer.class);
  private static final String[] SERVICES = {"", "gpumemd.v1.Allocator", "gpumemd.v1.Admin"};
  private static final int BACKEND_THREADS = 8;

  private final ServerConfig config;
  private final MemoryBackend backend;
  private final DevicePools pools;
  private final SessionRegistry registry;
  private final HealthStatusManager health = new HealthStatusManager();
  private final List<Server> servers = new ArrayList<>();
  private final EventLoopGroup bossGroup;
  private final EventLoopGroup workerGroup;
  private final ExecutorService blockingExecutor;
  private final ScheduledExecutorService housekeeping;
  private final PrometheusMeterRegistry meterRegistry;
  private MetricsHttpServer metricsServer;
  private Path socketPath;
  private int tcpPort = -1;
  private volatile boolean force;
  private final AtomicInteger shutdownState = new AtomicInteger();
  private final Object terminated = new Object();

  private GpumemdServer(ServerConfig config, MemoryBackend backend, Ticker ticker) {
    this.config = config;
    this.backend = backend;
    AtomicReference<SessionRegistry> registryRef = new AtomicReference<>();
    List<DevicePool> list = new ArrayList<>();
    for (DeviceInfo device : backend.devices()) {
      long limit = config.deviceLimit(device.capacityBytes());
      long cap = config.retentionCapBytes() < 0 ? limit : config.retentionCapBytes();
      list.add(new DevicePool(device, backend, new PoolSettings(limit, cap, config.maxOversizeBytes(), config.unmapWaitMillis()),
          (holder, dev, segment) -> registryRef.get().requestUnmap(holder, dev, segment),
          DevicePools.segmentIdBase(device.ordinal())));
    }
    this.pools = new DevicePools(list);
    this.registry = new SessionRegistry(pools, backend, config.sessionSettings(), ticker);
    registryRef.set(registry);
    this.bossGroup = new EpollEventLoopGroup(1, daemonThreads("gpumemd-accept"));
    this.workerGroup = new EpollEventLoopGroup(Math.max(2, Runtime.getRuntime().availableProcessors()),
        daemonThreads("gpumemd-io"));
    // Misses and zeroing: backend calls that may take milliseconds, and a miss may wait for
    // unmaps. With an unbounded queue a ThreadPoolExecutor never grows past its core size, so
    // core = max, and idle threads time out.
    ThreadPoolExecutor backendPool = new ThreadPoolExecutor(BACKEND_THREADS, BACKEND_THREADS, 30, TimeUnit.SECONDS,
        new LinkedBlockingQueue<>(), daemonThreads("gpumemd-backend"));
    backendPool.allowCoreThreadTimeOut(true);
    this.blockingExecutor = backendPool;
    ScheduledThreadPoolExecutor scheduler = new ScheduledThreadPoolExecutor(1, daemonThreads("gpumemd-housekeeping"));
    scheduler.setRemoveOnCancelPolicy(true);
    this.housekeeping = scheduler;
    this.meterRegistry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
  }

  private static java.util.concurrent.ThreadFactory daemonThreads(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  /** Starts the daemon with the system clock. */
  public static GpumemdServer start(ServerConfig config) throws IOException {
    return start(config, Ticker.system());
  }

  /**
   * Chooses the backend, builds the pools and opens the listeners.
   *
   * @throws IOException when a listener cannot be bound
   * @throws io.gpumemd.server.backend.BackendException when the backend cannot start
   */
  public static GpumemdServer start(ServerConfig config, Ticker ticker) throws IOException {
    if (!Epoll.isAvailable()) {
      throw new IOException("the epoll transport is unavailable: " + Epoll.unavailabilityCause());
    }
    BackendSelector.Selection selection = BackendSelector.select(config);
    log.info("Backend: {} ({})", selection.backend().name(), selection.reason());
    GpumemdServer server = new GpumemdServer(config, selection.backend(), ticker);
    try {
      server.startServices();
    } catch (IOException | RuntimeException e) {
      server.shutdown(true);
      throw e;
    }
    return server;
  }

  private void startServices() throws IOException {
    for (DevicePool pool : pools.all()) {
      DeviceInfo d = pool.device();
      var stats = pool.stats();
      log.info("Device {}: {} {} ({}), capacity {}, budget {}, retention cap {}", d.ordinal(), d.backend(),
          d.name(), d.uuid(), SizeClasses.format(d.capacityBytes()), SizeClasses.format(pool.limitBytes()),
          SizeClasses.format(stats.retentionCapBytes()));
    }
    ServerMetrics metrics = new ServerMetrics(meterRegistry, pools, registry);
    List<ServerServiceDefinition> services = List.of(
        DocumentedSchema.bind(new AllocatorService(registry, blockingExecutor, metrics)),
        DocumentedSchema.bind(new AdminService(pools, registry)),
        health.getHealthService().bindService(),
        ProtoReflectionServiceV1.newInstance().bindService(),
        ProtoReflectionService.newInstance().bindService());
    for (String service : SERVICES) {
      health.setStatus(service, ServingStatus.SERVING);
    }
    if (config.socket() != null) {
      Path path = config.socket().toAbsolutePath();
      prepareSocketPath(path);
      Server uds = build(NettyServerBuilder.forAddress(new DomainSocketAddress(path.toString()))
          .channelType(EpollServerDomainSocketChannel.class), services).start();
      servers.add(uds);
      socketPath = path; // ours from now on: removed at shutdown
      Files.setPosixFilePermissions(socketPath,
          PosixFilePermissions.fromString(config.shmGroup().isEmpty() ? "rw-------" : "rw-rw----"));
      log.info("Listening on unix://{}", socketPath);
    }
    if (config.tcpEnabled()) {
      Server tcp = build(NettyServerBuilder.forAddress(new InetSocketAddress(config.listenHost(), config.listenPort()))
          .channelType(EpollServerSocketChannel.class), services).start();
      servers.add(tcp);
      tcpPort = ((InetSocketAddress) tcp.getListenSockets().get(0)).getPort();
      log.info("Listening on tcp://{}:{}", config.listenHost(), tcpPort);
    }
    if (config.metricsPort() > 0) {
      metricsServer = new MetricsHttpServer(config.metricsHost(), config.metricsPort(), meterRegistry);
      log.info("Metrics on http://{}:{}/metrics", config.metricsHost(), metricsServer.port());
    }
    housekeeping.scheduleWithFixedDelay(this::reap, 100, 100, TimeUnit.MILLISECONDS);
    if (backend.name().equals("cuda")) {
      housekeeping.scheduleWithFixedDelay(this::pollEvents, 2, 2, TimeUnit.MILLISECONDS);
    }
    log.info("gpumemd ready: {} device(s) on the {} backend", pools.size(), backend.name());
  }

  private Server build(NettyServerBuilder builder, List<ServerServiceDefinition> services) {
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
    return builder.build();
  }

  /** Removes a stale socket file, refusing if a live daemon still answers on it. */
  private static void prepareSocketPath(Path path) throws IOException {
    Files.createDirectories(path.getParent());
    if (!Files.exists(path)) {
      return;
    }
    try (SocketChannel probe = SocketChannel.open(StandardProtocolFamily.UNIX)) {
      probe.connect(UnixDomainSocketAddress.of(path));
      throw new IOException("socket: " + path + " is in use by a running process (expected: a free path)");
    } catch (IOException e) {
      if (e.getMessage() != null && e.getMessage().startsWith("socket: ")) {
        throw e;
      }
      Files.delete(path); // nobody listens: left by a daemon that died
    }
  }

  private void reap() {
    try {
      registry.reap();
    } catch (RuntimeException e) {
      log.error("Session housekeeping failed", e);
    }
  }

  private void pollEvents() {
    for (DevicePool pool : pools.all()) {
      try {
        if (pool.hasAwaitingEvents()) {
          pool.pollEvents();
        }
      } catch (RuntimeException e) {
        log.error("Completion event polling failed on device {}", pool.device().ordinal(), e);
      }
    }
  }

  public DevicePools pools() {
    return pools;
  }

  public SessionRegistry registry() {
    return registry;
  }

  public MemoryBackend backend() {
    return backend;
  }

  /** The bound TCP port, or -1 without a TCP listener. */
  public int tcpPort() {
    return tcpPort;
  }

  /** The bound metrics port, or -1 when metrics are off. */
  public int metricsPort() {
    return metricsServer == null ? -1 : metricsServer.port();
  }

  public Path socketPath() {
    return socketPath;
  }

  /**
   * Drains and stops: health NOT_SERVING, new leases UNAVAILABLE, clients told, leases drain
   * up to the configured timeout (or not at all with {@code force}), then every session ends,
   * the listeners close and all memory is freed. Runs once; a second call with {@code force}
   * cuts a running drain short, any other later call waits for the first to finish.
   */
  public void shutdown(boolean force) {
    if (force) {
      this.force = true;
    }
    if (!shutdownState.compareAndSet(0, 1)) {
      awaitTermination();
      return;
    }
    try {
      health.enterTerminalState();
      long drainMillis = this.force ? 0 : config.drainTimeoutMillis();
      int live = registry.liveLeases();
      log.info("Shutting down: draining {} lease(s) for up to {} ms", live, drainMillis);
      registry.beginDrain(drainMillis);
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(drainMillis);
      while (!this.force && registry.liveLeases() > 0 && System.nanoTime() < deadline) {
        sleep(20);
      }
      int left = registry.liveLeases();
      if (left > 0) {
        log.warn("Drain ended with {} lease(s) still held; freeing them", left);
      }
      registry.endAll("server shutdown");
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
      housekeeping.shutdownNow();
      blockingExecutor.shutdown();
      try {
        blockingExecutor.awaitTermination(2, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      if (metricsServer != null) {
        metricsServer.close();
      }
      pools.close();
      backend.close();
      bossGroup.shutdownGracefully(0, 1, TimeUnit.SECONDS);
      workerGroup.shutdownGracefully(0, 1, TimeUnit.SECONDS);
      if (socketPath != null) {
        try {
          Files.deleteIfExists(socketPath);
        } catch (IOException e) {
          log.warn("Cannot remove socket {}: {}", socketPath, e.toString());
        }
      }
      log.info("gpumemd stopped; all device memory freed");
    } finally {
      synchronized (terminated) {
        shutdownState.set(2);
        terminated.notifyAll();
      }
    }
  }

  /** Waits until a shutdown has finished. */
  public void awaitTermination() {
    synchronized (terminated) {
      while (shutdownState.get() != 2) {
        try {
          terminated.wait();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return;
        }
      }
    }
  }

  private static void sleep(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
