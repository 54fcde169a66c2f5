package io.gpumemd.server;

import io.gpumemd.common.Sizes;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.AuthInterceptor;
import io.gpumemd.server.auth.BearerTokens;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.backend.BackendSelector;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.config.BackendConfig;
import io.gpumemd.server.config.ListenerConfig;
import io.gpumemd.server.config.PoolConfig;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.fd.DescriptorPushes;
import io.gpumemd.server.fd.DescriptorPins;
import io.gpumemd.server.fd.FdChannel;
import io.gpumemd.server.fd.FdGrants;
import io.gpumemd.server.grpc.AdminService;
import io.gpumemd.server.grpc.AllocatorService;
import io.gpumemd.server.grpc.StreamWatchdog;
import io.gpumemd.server.grpc.DocumentedSchema;
import io.gpumemd.server.metrics.IsolatingPrometheusRegistry;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.takeover.HandOver;
import io.gpumemd.server.takeover.HandOverGate;
import io.gpumemd.server.takeover.HandOverInterceptor;
import io.gpumemd.server.takeover.Rehearsal;
import io.gpumemd.server.takeover.TakeOver;
import io.gpumemd.server.takeover.TakeOverState;
import io.grpc.ServerServiceDefinition;
import io.grpc.health.v1.HealthCheckResponse.ServingStatus;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.protobuf.services.HealthStatusManager;
import io.grpc.protobuf.services.ProtoReflectionService;
import io.grpc.protobuf.services.ProtoReflectionServiceV1;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The running daemon: wires the backend, pools, sessions, gRPC services (with health and
 * reflection), {@link Listeners}, metrics and {@link Housekeeping}; a successor rehearses its
 * take-over ({@link Rehearsal}) before it asks for the running daemon's state. Every way down
 * (shutdown, failed start, failed take-over, hand-over) is {@link DaemonStop}'s one ordered stop.
 *
 * <p>Owns every resource it starts. {@link #start} either returns a running daemon or, having
 * released whatever it had started, throws; {@link #shutdown} may be called from any thread and
 * runs once (later calls wait for it, or, with {@code force}, cut the drain short).
 */
public final class GpumemdServer {
  private static final Logger log = LoggerFactory.getLogger(GpumemdServer.class);
  private static final String[] SERVICES = {"", "gpumemd.v1.Allocator", "gpumemd.v1.Admin"};
  private static final int BACKEND_THREADS = 8;
  /** How long a successor retries binding the metrics port the running daemon is closing. */
  private static final long METRICS_RETRY_MILLIS = 15_000;
  static final String VERSION = versionOf(GpumemdServer.class);

  private final ServerConfig config;
  private final MemoryBackend backend;
  private final DevicePools pools;
  private final SessionRegistry registry;
  private final HealthStatusManager health = new HealthStatusManager();
  private final ThreadPoolExecutor blockingExecutor;
  private final PrometheusMeterRegistry meterRegistry = IsolatingPrometheusRegistry.newMeterRegistry();
  private final ServerMetrics metrics;
  private final IdentityPolicy identities;
  private final Listeners listeners;
  private final Readiness readiness;
  private final StreamWatchdog streams;
  /** Where fd-channel connections bind sessions for pushed descriptors; null when the backend passes none. */
  private final DescriptorPushes pushes;
  private final Ticker ticker;
  /**
   * The longest a successor waits, once it serves, for the sessions that had a stream at the
   * hand-over to attach one here before it finishes its start (past it, a client that is slow or
   * gone does not hold the daemon's housekeeping and readiness back).
   */
  private static final long REATTACH_WAIT_MILLIS = 100;
  /** Closed from the start in a successor: it applies nothing until it holds the running daemon's state. */
  private final HandOverGate gate;
  /** Who was sent which segment's descriptor; null without an fd channel. */
  private DescriptorPins pins;
  private HandOver handOver;
  /** Where {@link #handOver} was bound: its path, or beside it until published. */
  private Path handOverAt;
  private final DaemonStop stop;
  /** Set once this daemon, taking over, told the running daemon it took the state. */
  private boolean takenOver;
  /** Says what a take-over restored; run once this daemon serves (see TakeOverState#restoreSessions). */
  private Runnable restoredLog = () -> { };

  private static String versionOf(Class<?> c) {
    String v = c.getPackage() == null ? null : c.getPackage().getImplementationVersion();
    return v == null ? "dev" : v;
  }

  private GpumemdServer(ServerConfig config, MemoryBackend backend, Ticker ticker, BearerTokens tokens) {
    this.config = config;
    // A successor's TCP listener shares its port with the running daemon's (SO_REUSEPORT) while it
    // restores: what connects there meanwhile is told "moving" and calls again.
    this.gate = new HandOverGate(config.takeOver().takeOver());
    this.backend = backend;
    this.ticker = ticker;
    Rehearsal.Books books = books(config, backend, ticker, true);
    this.pools = books.pools();
    this.registry = books.registry();
    // Misses and zeroing: backend calls that may take milliseconds, and a miss may wait for
    // unmaps. With an unbounded queue a ThreadPoolExecutor never grows past its core size, so
    // core = max, and idle threads time out.
    this.blockingExecutor = new ThreadPoolExecutor(BACKEND_THREADS, BACKEND_THREADS, 30, TimeUnit.SECONDS,
        new LinkedBlockingQueue<>(), Listeners.daemonThreads("gpumemd-backend"));
    blockingExecutor.allowCoreThreadTimeOut(true);
    this.metrics = new ServerMetrics(meterRegistry, pools, registry::sessionCount, backend);
    ServerMetrics.bindHostStore(meterRegistry, registry.sleep().store());
    this.streams = new StreamWatchdog(config.transport().streamStallMillis(), ticker);
    this.pushes = backend.passesDescriptors() ? new DescriptorPushes() : null;
    List<ServerServiceDefinition> services = List.of(
        DocumentedSchema.bind(new AllocatorService(registry, blockingExecutor, metrics, streams, gate, pushes)),
        DocumentedSchema.bind(new AdminService(pools, registry, blockingExecutor,
            config.pool().unmapWaitMillis())),
        health.getHealthService().bindService(),
        ProtoReflectionServiceV1.newInstance().bindService(),
        ProtoReflectionService.newInstance().bindService());
    this.identities = config.tenancy().identityPolicy(IdentityPolicy.currentUid());
    this.listeners = new Listeners(services, identities, new AuthInterceptor(tokens, config.security().insecureTcp()),
        new HandOverInterceptor(gate), config.transport());
    this.readiness = new Readiness(listeners, backend instanceof HostShmBackend host ? host.root() : null,
        registry::liveLeases);
    this.stop = new DaemonStop(new DaemonStop.Parts(config, readiness, health, listeners, registry, blockingExecutor,
        pools, backend));
  }

  /**
   * New pools, one per device, and the session registry over them, as configured; {@code warn}
   * logs a retention cap above a device's budget (the daemon's own books, not a rehearsal's).
   */
  private static Rehearsal.Books books(ServerConfig config, MemoryBackend backend, Ticker ticker, boolean warn) {
    // Sessions first: the pools send unmap requests to them, the registry owns them.
    LiveSessions sessions = new LiveSessions();
    List<DevicePool> list = new ArrayList<>();
    PoolConfig pool = config.pool();
    for (DeviceInfo device : backend.devices()) {
      long limit = pool.deviceLimit(device.capacityBytes());
      long cap = pool.retentionCapBytes() < 0 ? limit : Math.min(pool.retentionCapBytes(), limit);
      if (warn && pool.retentionCapBytes() > limit) {
        log.warn("retention-cap-bytes: {} is above the budget of device {} ({}); using the budget",
            pool.retentionCapBytes(), device.ordinal(), limit);
      }
      list.add(new DevicePool(device, backend,
          new PoolSettings(limit, cap, pool.maxOversizeBytes(), pool.unmapWaitMillis(), pool.publishedLimit(limit)),
          sessions, DevicePools.segmentIdBase(device.ordinal()), ticker));
    }
    DevicePools pools = new DevicePools(list);
    SessionRegistry registry = new SessionRegistry(pools, backend, SessionSettings.from(config), ticker, sessions,
        config.pool().offloadMaxBytes());
    if (config.pool().parkIdleObjects()) {
      registry.sharing().parkIdleObjectsWhenShort();
    }
    return new Rehearsal.Books(pools, registry, backend);
  }

  /**
   * The tokens file, or null without one. It was checked when the configuration was parsed; a
   * file broken since then fails the start like a listener that cannot bind.
   */
  private static BearerTokens loadTokens(ServerConfig config, Ticker ticker) throws IOException {
    Path file = config.security().tokensFile();
    if (file == null) {
      return null;
    }
    try {
      return BearerTokens.load(file, ticker);
    } catch (IllegalArgumentException e) {
      throw new IOException("tokens-file: '" + file + "' (expected: " + e.getMessage() + ")");
    }
  }

  /** Starts the daemon with the system clock. */
  public static GpumemdServer start(ServerConfig config) throws IOException {
    return start(config, Ticker.system());
  }

  /**
   * Chooses the backend, builds the pools and opens the listeners. On failure everything
   * started so far is released quietly (the caller reports the error) and the exception
   * propagates.
   *
   * @throws IOException when a listener cannot be bound (the message names it)
   * @throws io.gpumemd.server.backend.BackendException when the backend cannot start
   */
  public static GpumemdServer start(ServerConfig config, Ticker ticker) throws IOException {
    if (!Epoll.isAvailable()) {
      throw new IOException("the epoll transport is unavailable: " + Epoll.unavailabilityCause());
    }
    JulBridge.install();
    BearerTokens tokens = loadTokens(config, ticker);
    BackendConfig wanted = config.backend();
    Path fdSocket = config.fdChannel().socket();
    String descriptorsAt = wanted.hostSegmentsByFd() ? fdSocket.toAbsolutePath().toString() : null;
    BackendSelector.Selection selection = BackendSelector.select(wanted.kind(),
        () -> new HostShmBackend(wanted.shmDir(), wanted.hostDevices(), wanted.hostDeviceBytes(), wanted.shmGroup(),
            descriptorsAt),
        new BackendSelector.CudaOptions(wanted.cudaHandles(),
            fdSocket == null ? null : fdSocket.toAbsolutePath().toString()));
    MemoryBackend backend = selection.backend();
    boolean takingOver = config.takeOver().takeOver();
    String cannotTakeOver = takingOver ? backend.takeOverRefusal() : null;
    if (cannotTakeOver != null) {
      backend.close();
      throw new IOException("take-over: this daemon's configuration cannot hold a predecessor's memory: "
          + cannotTakeOver);
    }
    GpumemdServer server;
    try {
      server = new GpumemdServer(config, backend, ticker, tokens);
    } catch (RuntimeException e) {
      backend.close();
      throw e;
    }
    TakeOver takeOver = null;
    try {
      // Everything that does not need the running daemon's state is built, bound and run once
      // first: its requests wait only for the state and its restore.
      server.bindListeners(selection.reason(), takingOver);
      if (takingOver) {
        server.bindHandOver(true);
        Rehearsal.run(b -> books(config, b, ticker, false), server.scratchOnOwnBackend() ? backend : null,
            server.stage(),
            Rehearsal.channelPath(config.takeOver().socket()), server.listeners.unixBoundAt());
        takeOver = TakeOverState.request(config, backend, VERSION, server.listeners.unixBoundAt());
        if (takeOver != null) {
          TakeOverState.restorePools(takeOver, server.pools);
          if (server.pins != null) {
            server.pins.adopt(takeOver.takeHiddenProcessPidfds());
          }
          server.restoredLog = TakeOverState.restoreSessions(takeOver, server.registry);
        }
      }
      server.startServices(takeOver);
    } catch (IOException | RuntimeException e) {
      if (takeOver != null && !server.takenOver) {
        takeOver.abort(e.getMessage());
        takeOver.close();
        server.stop.run(DaemonStop.Reason.FAILED_TAKE_OVER, 0);
        throw e instanceof IOException io ? io
            : new IOException("take-over: restoring the state failed (" + e.getMessage() + "); the running daemon "
                + "serves on", e);
      }
      server.stop.run(DaemonStop.Reason.FAILED_START, 0);
      throw e;
    }
    return server;
  }

  /**
   * What serves a rehearsal's scratch books: this daemon's Allocator service and health over them,
   * with metrics of their own, on the Unix listener's event loops ({@link Listeners#scratchUnix}).
   * Null without a Unix listener.
   */
  private Rehearsal.Stage stage() {
    if (listeners.unixBoundAt() == null) {
      return null;
    }
    return (books, at) -> {
      ServerMetrics scratchMetrics = new ServerMetrics(IsolatingPrometheusRegistry.newMeterRegistry(), books.pools(),
          books.registry()::sessionCount, backend);
      return listeners.scratchUnix(List.of(
          DocumentedSchema.bind(new AllocatorService(books.registry(), blockingExecutor, scratchMetrics,
              new StreamWatchdog(config.transport().streamStallMillis(), ticker))),
          new HealthStatusManager().getHealthService().bindService()), at);
    };
  }

  /**
   * Whether scratch books on this daemon's own backend can be leased on and served: only host
   * segments passed as descriptors are neither device memory nor files beside the running
   * daemon's.
   */
  private boolean scratchOnOwnBackend() {
    return backend instanceof HostShmBackend && backend.passesDescriptors();
  }

  /** Logs what this daemon serves and binds its listeners, where no client finds them yet ({@link Listeners#publish}). */
  private void bindListeners(String backendReason, boolean takingOver) throws IOException {
    log.info("Backend: {} ({})", backend.name(), backendReason);
    for (DevicePool pool : pools.all()) {
      DeviceInfo d = pool.device();
      log.info("Device {}: {} {} ({}), capacity {}, budget {}, retention cap {}", d.ordinal(), d.backend(),
          d.name(), d.uuid(), Sizes.format(d.capacityBytes()), Sizes.format(pool.limitBytes()),
          Sizes.format(pool.stats().get(PoolMetric.RETENTION_CAP_BYTES)));
    }
    log.info("Identity: {}; {}", identities, config.tenancy().isolateSessions()
        ? "every session has segments of its own" : "sessions of one tenant share segments, tenants never do");
    if (takingOver) {
      listeners.takingOver();
    }
    ListenerConfig addresses = config.listeners();
    if (addresses.socket() != null) {
      listeners.startUnix(addresses.socket(), config.tenancy().socketMode(), config.tenancy().socketGroup());
    }
    if (backend.passesDescriptors()) {
      pins = new DescriptorPins(pools, ticker);
      listeners.startFd(config.fdChannel().socket(), config.tenancy().socketMode(), config.tenancy().socketGroup(),
          new FdChannel(identities, new FdGrants(registry, pins), pushes, gate, config.fdChannel(), ticker));
    }
    if (addresses.tcpEnabled()) {
      listeners.startTcp(addresses.listenHost(), addresses.listenPort(), config.security());
    }
  }

  /**
   * Binds the take-over socket, if there is one: {@code beside} its path (a successor, whose
   * predecessor's socket is there until {@link #startServices} replaces it), or at it once a
   * stale one is cleared.
   */
  private void bindHandOver(boolean beside) throws IOException {
    Path socket = config.takeOver().socket();
    if (socket == null) {
      return;
    }
    SocketFiles.removeStaleTemporaries(socket);
    if (!beside) {
      HandOver.clearStale(socket);
    }
    handOverAt = beside ? SocketFiles.temporaryPath(socket.toAbsolutePath()) : socket;
    // A successor ran the state's way out in its rehearsal; a daemon that started fresh runs it
    // when its first successor asks, before the gate closes.
    Runnable rehearsal = beside ? () -> { }
        : Rehearsal.beforeFirstHandOver(b -> books(config, b, ticker, false), stage(), Rehearsal.channelPath(socket));
    handOver = new HandOver(socket, handOverAt, gate,
        new TakeOverState.RunningDaemon(backend, pools, registry, pins, this::handedOver, rehearsal), VERSION);
    stop.handOver(handOver);
  }

  /**
   * Starts serving: the sockets move to their paths (over the running daemon's, which is told), the
   * take-over socket, metrics and housekeeping start.
   */
  private void startServices(TakeOver takeOver) throws IOException {
    if (takeOver == null) {
      listeners.noPredecessor();
    }
    for (String service : SERVICES) {
      health.setStatus(service, ServingStatus.SERVING);
    }
    Path handOverSocket = config.takeOver().socket();
    if (handOver == null) {
      bindHandOver(false);
    } else if (takeOver == null) {
      HandOver.clearStale(handOverSocket); // nobody answered there: a stale socket at most
    }
    if (takeOver != null) {
      // The point of no return: the running daemon stops for good once it reads this.
      takeOver.taken();
      takenOver = true;
    }
    gate.open();
    listeners.publish();
    if (takeOver != null) {
      takeOver.live(); // first: the running daemon's clients move once it hears this
      // They reattach now. On two busy cores, finishing this start meanwhile (the logs, metrics,
      // housekeeping, the take-over socket) delayed their streams' first messages here by 5-20
      // ms, inside their pause; none of it is needed to serve them.
      registry.awaitStreams(takeOver.attachedSessions(), REATTACH_WAIT_MILLIS);
    }
    if (handOver != null && !handOverAt.equals(handOverSocket)) {
      HandOver.publishAt(handOverAt, handOverSocket);
    }
    if (takeOver != null) {
      takeOver.close();
      restoredLog.run();
      log.info("Took over from pid {}: {} session(s) and {} lease(s) resumed here", takeOver.runningDaemonPid(),
          registry.sessionCount(), registry.liveLeases());
    }
    startMetrics(takeOver != null);
    stop.housekeeping(
        new Housekeeping(registry, pools, streams, backend.supportsCompletionEvents(), gate, pins, metrics));
    if (handOver != null) {
      handOver.start();
    }
    readiness.serving();
    log.info("gpumemd ready: {} device(s) on the {} backend", pools.size(), backend.name());
  }

  private void startMetrics(boolean tookOver) throws IOException {
    ListenerConfig addresses = config.listeners();
    if (addresses.metricsPort() <= 0) {
      return;
    }
    try {
      listeners.startMetrics(addresses.metricsHost(), addresses.metricsPort(), meterRegistry, metrics::refresh,
          readiness, tookOver ? METRICS_RETRY_MILLIS : 0);
    } catch (IOException e) {
      if (!tookOver) {
        throw e;
      }
      // Past the point of no return the sessions are this daemon's: serve them without metrics
      // rather than free their memory.
      log.error("{}; serving without metrics and probes", e.getMessage());
    }
  }

  /** A successor took the state: stop serving for good, freeing no memory (the successor's now). */
  private void handedOver(int successorPid) {
    if (stop.begin()) {
      stop.run(DaemonStop.Reason.HANDED_OVER, successorPid);
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
    return listeners.tcpPort();
  }

  /** The bound metrics port, or -1 when metrics are off. */
  public int metricsPort() {
    return listeners.metricsPort();
  }

  public Path socketPath() {
    return listeners.socketPath();
  }

  /** The fd channel's socket, or null when the backend passes no descriptors. */
  public Path fdSocketPath() {
    return listeners.fdSocketPath();
  }

  /** The fd channel (its counts, for tests and operators), or null when the backend passes no descriptors. */
  public FdChannel fdChannel() {
    return listeners.fdChannel();
  }

  /**
   * Drains and stops: /readyz 503 and health NOT_SERVING, new leases UNAVAILABLE, clients told,
   * leases drain up to the configured timeout (or not at all with {@code force}), then every
   * session ends, the listeners close and all memory is freed. Runs once; a second call with
   * {@code force} cuts a running drain short, any other later call waits for the first to finish.
   */
  public void shutdown(boolean force) {
    if (force) {
      stop.force();
    }
    if (handOver != null) {
      handOver.close(); // no new take-over; one in progress ends first, handed over or not
    }
    if (stop.exitAfterHandOver()) {
      return;
    }
    if (!stop.begin()) {
      awaitTermination();
      return;
    }
    stop.run(DaemonStop.Reason.SHUTDOWN, 0);
  }

  /** Waits until a shutdown has finished. */
  public void awaitTermination() {
    stop.awaitTermination();
  }
}
