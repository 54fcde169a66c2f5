package io.gpumemd.server.fd;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.books.BooksGate;
import io.gpumemd.server.config.FdChannelConfig;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.bootstrap.ServerBootstrap;
import io.grpc.netty.shaded.io.netty.channel.Channel;
import io.grpc.netty.shaded.io.netty.channel.ChannelInitializer;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.WriteBufferWaterMark;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.netty.shaded.io.netty.channel.unix.Errors;
import io.grpc.netty.shaded.io.netty.channel.unix.PeerCredentials;
import io.grpc.netty.shaded.io.netty.handler.codec.LengthFieldBasedFrameDecoder;
import io.grpc.netty.shaded.io.netty.util.concurrent.DefaultThreadFactory;
import java.io.IOException;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The fd channel: a Unix socket of its own where a client process fetches the file descriptor
 * of a segment its session holds ({@code --host-segments fd}, or a CUDA VMM segment with {@code
 * --cuda-handles vmm}). gRPC cannot carry descriptors,
 * so this is a small protocol of its own, documented with its messages in {@code gpumemd.proto}
 * (FdRequest): length-prefixed protobuf frames, and after a reply that grants a descriptor one
 * byte carrying it as {@code SCM_RIGHTS} ancillary data.
 *
 * <p>Transport: Netty's epoll domain-socket channel, which grpc-netty-shaded already ships (no
 * new dependency): it reads the peer's credentials ({@code SO_PEERCRED}) and writes a {@code
 * FileDescriptor} message with {@code sendmsg}/{@code SCM_RIGHTS}. Reads stay in byte mode (the
 * daemon never receives descriptors: any a peer sends are closed by the kernel). One event-loop
 * thread serves every connection: a request costs microseconds, and a process asks once per
 * segment.
 *
 * <p>Who connects: anyone the socket's mode and group let in (the gRPC socket's); who they are
 * is the kernel's word, read once per connection and turned into a {@link Caller} by the
 * daemon's {@link IdentityPolicy}, as on the gRPC socket; what they get is {@link FdGrants}'
 * decision.
 *
 * <p>Bounds, so that no peer and no tenant can fill the channel for the others:
 *
 * <ul>
 *   <li>live connections ({@code --fd-max-connections}) and live connections of one tenant
 *       ({@code --fd-max-connections-per-tenant}): more are closed as they are accepted; so is
 *       a connection from a process in a PID namespace the daemon cannot see, beyond {@link
 *       DescriptorPins#MAX_HIDDEN_PROCESSES_PER_TENANT} such processes of its tenant;
 *   <li>descriptors in flight, opened for replies and not yet sent ({@code --fd-max-in-flight}),
 *       and those of one tenant's connections ({@code --fd-max-in-flight-per-tenant}): beyond
 *       either a request is refused RESOURCE_EXHAUSTED naming the flag;
 *   <li>time: a connection without a complete request {@code --fd-first-request-timeout-ms}
 *       after it connected, one idle for {@code --fd-idle-timeout-seconds} (no complete request,
 *       no reply owed), and one whose owed replies go unwritten for {@code
 *       --fd-stall-timeout-ms} are closed, the last with its unsent descriptors, so that their
 *       places in flight come back (one whose peer has replies unread in its socket stays open
 *       and counted, sending nothing, until the peer reads or closes: see below);
 *   <li>per connection {@link #REQUESTS_PER_SECOND}, {@link #MAX_UNSENT_PER_CONNECTION} and the
 *       reply bytes Netty queues ({@link #WRITE_BUFFER}; see {@link FdConnection});
 *   <li>descriptors sent and not yet read, which the kernel charges to the daemon's user: a
 *       connection whose peer has replies unread is not closed but kept, sending nothing more
 *       and counted under the connection bounds, until the peer reads them or closes ({@link
 *       ConnectionEnd}).
 * </ul>
 *
 * Refusals are logged one WARN line a minute at most per kind ({@link RefusalLog}); so are the
 * connections closed for a first request that never came or replies never read. Idle closes
 * are routine (a client reconnects on its next fetch) and logged at DEBUG only.
 *
 * <p>Thread-safety: {@link #bind} and {@link #close} are called by one thread (the daemon's
 * start and shutdown); the counts are atomic and may be read from any thread.
 */
public final class FdChannel implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(FdChannel.class);
  /** Requests one connection may make per second (a burst of as many is allowed). */
  static final int REQUESTS_PER_SECOND = 1000;
  /** Replies with descriptors waiting unsent on one connection before it is read no more. */
  static final int MAX_UNSENT_PER_CONNECTION = 16;
  /** Longest request frame; an FdRequest is under 100 bytes. */
  static final int MAX_REQUEST_BYTES = 4096;
  /**
   * Reply bytes Netty may queue for one connection before it counts as not writable, and its
   * requests wait unread and unanswered: 16 replies with descriptors take about 4 KiB with
   * Netty's per-message overhead, so only a peer that does not read its replies (refusals
   * included) reaches it. 1,000 connections at the mark hold 32 MiB.
   */
  static final WriteBufferWaterMark WRITE_BUFFER = new WriteBufferWaterMark(16 << 10, 32 << 10);
  /**
   * Longest a Lease reply waits for a push handed to the event loop (which was writing on the
   * connection); past it the reply goes, and the client asks.
   */
  static final long PUSH_WAIT_MILLIS = 20;
  /** Room for a pushed reply's frame: an FdReply with a grant is under 64 bytes. */
  static final int MAX_PUSH_BYTES = 256;
  /**
   * The most a peer may have unread of a connection's sends ({@code SIOCOUTQ}, the kernel's
   * buffer memory, about 1.5 KiB per pushed reply with its descriptor) for the daemon to push
   * more there: a client that never reads its pushes holds a few, not a socket buffer's worth.
   */
  static final int MAX_UNREAD_FOR_PUSH = 8 << 10;

  /** The kernel's errno for a sender past its share of descriptors in flight. */
  private static final int ETOOMANYREFS = 109;

  private final IdentityPolicy identities;
  private final FdGrants grants;
  private final DescriptorPushes pushes;
  private final BooksGate gate;
  private final int maxConnections;
  private final int maxInFlight;
  private final long firstRequestNanos;
  private final long idleNanos;
  private final long stallNanos;
  private final Ticker ticker;
  private final AtomicInteger live = new AtomicInteger();
  private final AtomicInteger inFlight = new AtomicInteger();
  private final TenantCounts liveByTenant;
  private final TenantCounts inFlightByTenant;
  private final RefusalLog connectionRefusals;
  private final RefusalLog requestRefusals;
  private final RefusalLog deadlineCloses;
  private final RefusalLog inFlightFailures;
  private EventLoopGroup group;
  private Channel server;

  /** A channel whose bindings nobody pushes on, in a daemon that never hands over (tests of the channel alone). */
  public FdChannel(IdentityPolicy identities, FdGrants grants, FdChannelConfig config, Ticker ticker) {
    this(identities, grants, new DescriptorPushes(), BooksGate.ALWAYS_OPEN, config, ticker);
  }

  /**
   * @param pushes where connections bind sessions, and the Allocator service pushes through them
   * @param gate what a fetch's grant passes before it makes its holder in the books: while a
   *     hand-over has it closed, fetches wait for its end (see {@link FdConnection})
   */
  public FdChannel(IdentityPolicy identities, FdGrants grants, DescriptorPushes pushes, BooksGate gate,
      FdChannelConfig config, Ticker ticker) {
    this.identities = identities;
    this.grants = grants;
    this.pushes = pushes;
    this.gate = gate;
    this.maxConnections = config.maxConnections();
    this.maxInFlight = config.maxInFlight();
    this.firstRequestNanos = TimeUnit.MILLISECONDS.toNanos(config.firstRequestMillis());
    this.idleNanos = TimeUnit.SECONDS.toNanos(config.idleSeconds());
    this.stallNanos = TimeUnit.MILLISECONDS.toNanos(config.stallMillis());
    this.ticker = ticker;
    this.liveByTenant = new TenantCounts(config.maxConnectionsPerTenant());
    this.inFlightByTenant = new TenantCounts(config.maxInFlightPerTenant());
    this.connectionRefusals = new RefusalLog(log, "connection", ticker);
    this.requestRefusals = new RefusalLog(log, "request", ticker);
    this.deadlineCloses = new RefusalLog(log, "closed", "connection", ticker);
    this.inFlightFailures = new RefusalLog(log, "failed", "descriptor send", ticker);
  }

  /**
   * Listens on {@code socket}, which must be free (the caller removes a stale one and sets the
   * file's mode).
   *
   * @throws IOException naming the socket when it cannot be bound
   */
  public void bind(Path socket) throws IOException {
    group = new EpollEventLoopGroup(1, new DefaultThreadFactory("gpumemd-fd", true));
    ServerBootstrap bootstrap = new ServerBootstrap().group(group)
        .channel(EpollServerDomainSocketChannel.class)
        .childOption(ChannelOption.WRITE_BUFFER_WATER_MARK, WRITE_BUFFER)
        // A failed write shuts the output down instead of closing the socket under the
        // pipeline: the connection's own listener then closes it through ConnectionEnd, which
        // keeps it while the peer has replies unread (their descriptors are in flight).
        .childOption(ChannelOption.AUTO_CLOSE, false)
        .childHandler(new ChannelInitializer<EpollDomainSocketChannel>() {
          @Override
          protected void initChannel(EpollDomainSocketChannel connection) {
            accept(connection);
          }
        });
    try {
      server = bootstrap.bind(new DomainSocketAddress(socket.toString())).sync().channel();
    } catch (Exception e) {
      group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
      group = null;
      throw new IOException("fd listener: unix://" + socket + ": " + e.getMessage(), e);
    }
  }

  /**
   * Counts a new connection and learns its peer, or closes it: beyond the channel's bound, where
   * the credentials cannot be read, or beyond its tenant's bound.
   */
  private void accept(EpollDomainSocketChannel connection) {
    if (live.incrementAndGet() > maxConnections && maxConnections > 0) {
      live.decrementAndGet();
      connectionRefusals.refused(maxConnections + " live connections, the limit (flag --fd-max-connections)");
      connection.close();
      return;
    }
    connection.closeFuture().addListener(f -> live.decrementAndGet());
    Caller peer;
    try {
      PeerCredentials credentials = connection.peerCredentials();
      int[] gids = credentials.gids();
      peer = identities.unixPeer(credentials.uid(), gids.length > 0 ? gids[0] : Caller.UNKNOWN, credentials.pid());
    } catch (IOException e) {
      log.warn("fd channel: closing a connection whose peer credentials cannot be read: {}", e.toString());
      connection.close();
      return;
    }
    String tenant = peer.tenant();
    if (!liveByTenant.take(tenant)) {
      connectionRefusals.refused(peer + ": tenant " + tenant + " has " + liveByTenant.bound()
          + " live connections, its limit (flag --fd-max-connections-per-tenant)");
      connection.close();
      return;
    }
    connection.closeFuture().addListener(f -> liveByTenant.give(tenant));
    log.debug("fd channel: connection from {}", peer);
    String untrackable = grants.pins().connected(peer, connection.fd().intValue());
    if (untrackable != null) {
      connectionRefusals.refused(peer + ": " + untrackable);
      connection.close();
      return;
    }
    connection.config().setAllowHalfClosure(true); // a peer's end of input goes through ConnectionEnd
    FdConnection handler = new FdConnection(this, peer);
    connection.pipeline()
        .addLast(new ConnectionEnd(grants.pins(), peer, handler::stopPushes))
        .addLast(new LengthFieldBasedFrameDecoder(4 + MAX_REQUEST_BYTES, 0, 4, 0, 4, true))
        .addLast(handler);
  }

  FdGrants grants() {
    return grants;
  }

  /** What a fetch's grant passes (a push's is part of its lease, which passed it already). */
  BooksGate gate() {
    return gate;
  }

  DescriptorPushes pushes() {
    return pushes;
  }

  Ticker ticker() {
    return ticker;
  }

  long firstRequestNanos() {
    return firstRequestNanos;
  }

  /** 0 = never. */
  long idleNanos() {
    return idleNanos;
  }

  long stallNanos() {
    return stallNanos;
  }

  /**
   * How long a connection's deadline check may sleep: the shortest deadline, so that a check
   * armed for a later deadline (idle) never oversleeps one that a change of state starts (a
   * stall) by more than that deadline's own length.
   */
  long checkEveryNanos() {
    long shortest = Math.min(firstRequestNanos, stallNanos);
    return idleNanos > 0 ? Math.min(shortest, idleNanos) : shortest;
  }

  /**
   * Takes a place for one descriptor of {@code tenant} about to be opened: null when taken, else
   * the refusal. The tenant's bound is checked first: a tenant at its own bound is told so even
   * when the channel is full too.
   */
  Status reserveInFlight(String tenant) {
    if (!inFlightByTenant.take(tenant)) {
      return Status.RESOURCE_EXHAUSTED.withDescription("fd channel: " + inFlightByTenant.bound() + " descriptors for "
          + "tenant " + tenant + " are waiting to be sent, its limit (flag --fd-max-in-flight-per-tenant); read the "
          + "replies, or retry later");
    }
    if (inFlight.incrementAndGet() > maxInFlight) {
      inFlight.decrementAndGet();
      inFlightByTenant.give(tenant);
      return Status.RESOURCE_EXHAUSTED.withDescription("fd channel: " + maxInFlight + " descriptors are waiting to "
          + "be sent, the limit (flag --fd-max-in-flight); retry later");
    }
    return null;
  }

  /** A descriptor of {@code tenant} was sent and closed, or never opened. */
  void releaseInFlight(String tenant) {
    inFlight.decrementAndGet();
    inFlightByTenant.give(tenant);
  }

  /** A connection closed for a deadline that a well-behaved client never meets (counted, WARN a minute). */
  void closedPastDeadline(Caller peer, String why) {
    deadlineCloses.refused(peer + ": " + why);
  }

  /**
   * A descriptor's send failed. Most often the connection closed under it (DEBUG); the kernel's
   * {@code ETOOMANYREFS} is the daemon's user holding more descriptors in flight than its {@code
   * RLIMIT_NOFILE}, which fails every send until peers read: a WARN a minute, saying what to raise.
   */
  void descriptorSendFailed(Caller peer, Throwable cause) {
    // The failed write shut the output down: its promise carries that, caused by the kernel's error.
    Throwable kernel = cause;
    while (kernel != null && !(kernel instanceof Errors.NativeIoException)) {
      kernel = kernel.getCause();
    }
    if (kernel instanceof Errors.NativeIoException e && Math.abs(e.expectedErr()) == ETOOMANYREFS) {
      inFlightFailures.refused(peer + ": " + e.getMessage() + ": this daemon's user has more descriptors sent "
          + "and not yet read than its RLIMIT_NOFILE; raise it above --fd-max-connections times a socket buffer's "
          + "worth of replies (a few hundred each)");
    } else {
      log.debug("fd channel: sending a descriptor to {} failed: {}", peer, cause.toString());
    }
  }

  void refusedRequest(Caller peer, FdReply reply) {
    requestRefusals.refused(peer + ": " + Status.fromCodeValue(reply.getRefused().getCode()).getCode() + " "
        + reply.getRefused().getMessage());
  }

  /** Live connections. */
  public int liveConnections() {
    return live.get();
  }

  /** Live connections of {@code tenant}. */
  public int liveConnections(String tenant) {
    return liveByTenant.held(tenant);
  }

  /** Descriptors opened for replies and not yet sent and closed. */
  public int inFlight() {
    return inFlight.get();
  }

  /** Descriptors opened for replies to {@code tenant} and not yet sent and closed. */
  public int inFlight(String tenant) {
    return inFlightByTenant.held(tenant);
  }

  /** Stops listening and closes every connection (descriptors still queued are closed unsent). */
  @Override
  public void close() {
    if (server != null) {
      server.close().awaitUninterruptibly(2, TimeUnit.SECONDS);
    }
    if (group != null) {
      group.shutdownGracefully(0, 1, TimeUnit.SECONDS).awaitUninterruptibly(3, TimeUnit.SECONDS);
    }
  }
}
