package io.gpumemd.server.fd;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.config.FdChannelConfig;
import io.grpc.Status;
import io.grpc.netty.shaded.io.netty.bootstrap.ServerBootstrap;
import io.grpc.netty.shaded.io.netty.channel.Channel;
import io.grpc.netty.shaded.io.netty.channel.ChannelInitializer;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
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
 * decision. Bounds: live connections ({@code --fd-max-connections}; more are closed at once),
 * descriptors in flight over all connections ({@code --fd-max-in-flight}), and per connection
 * {@link #REQUESTS_PER_SECOND} and {@link #MAX_UNSENT_PER_CONNECTION} (see {@link
 * FdConnection}). Refusals are logged one WARN line a minute at most per kind ({@link
 * RefusalLog}).
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

  private final IdentityPolicy identities;
  private final FdGrants grants;
  private final int maxConnections;
  private final int maxInFlight;
  private final Ticker ticker;
  private final AtomicInteger live = new AtomicInteger();
  private final AtomicInteger inFlight = new AtomicInteger();
  private final RefusalLog connectionRefusals;
  private final RefusalLog requestRefusals;
  private EventLoopGroup group;
  private Channel server;

  public FdChannel(IdentityPolicy identities, FdGrants grants, FdChannelConfig config, Ticker ticker) {
    this.identities = identities;
    this.grants = grants;
    this.maxConnections = config.maxConnections();
    this.maxInFlight = config.maxInFlight();
    this.ticker = ticker;
    this.connectionRefusals = new RefusalLog(log, "connection", ticker);
    this.requestRefusals = new RefusalLog(log, "request", ticker);
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

  /** Counts a new connection and learns its peer, or closes it. */
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
    log.debug("fd channel: connection from {}", peer);
    grants.pins().connected(peer);
    connection.config().setAllowHalfClosure(true); // a peer's end of input goes through ConnectionEnd
    connection.pipeline()
        .addLast(new ConnectionEnd(grants.pins(), peer))
        .addLast(new LengthFieldBasedFrameDecoder(4 + MAX_REQUEST_BYTES, 0, 4, 0, 4, true))
        .addLast(new FdConnection(this, peer));
  }

  FdGrants grants() {
    return grants;
  }

  Ticker ticker() {
    return ticker;
  }

  int maxInFlight() {
    return maxInFlight;
  }

  /** Takes a place for one descriptor about to be opened; false at the limit. */
  boolean reserveInFlight() {
    if (inFlight.incrementAndGet() > maxInFlight) {
      inFlight.decrementAndGet();
      return false;
    }
    return true;
  }

  /** A descriptor was sent and closed, or never opened. */
  void releaseInFlight() {
    inFlight.decrementAndGet();
  }

  void refusedRequest(Caller peer, FdReply reply) {
    requestRefusals.refused(peer + ": " + Status.fromCodeValue(reply.getRefused().getCode()).getCode() + " "
        + reply.getRefused().getMessage());
  }

  /** Live connections. */
  public int liveConnections() {
    return live.get();
  }

  /** Descriptors opened for replies and not yet sent and closed. */
  public int inFlight() {
    return inFlight.get();
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
