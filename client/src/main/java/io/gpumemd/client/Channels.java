package io.gpumemd.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.TlsChannelCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import java.io.IOException;
import java.nio.file.Path;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Opens a channel to gpumemd from a target string: {@code unix:///path/to.sock} or {@code
 * host:port}. Each channel gets its own one-thread epoll event loop, and callbacks run on it
 * directly (no executor hop): the library never blocks in a callback.
 *
 * <p>{@link Security} adds TLS (TCP targets only: the Unix socket is never TLS, the kernel
 * vouches for its peers) and a bearer token sent on every call of the channel.
 */
public final class Channels {
  private static final Metadata.Key<String> AUTHORIZATION = Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private Channels() {}

  /**
   * How a channel proves itself and checks the daemon. Immutable.
   *
   * @param caCert the CA that signed the daemon's certificate (PEM); non-null turns TLS on
   * @param clientCert this client's certificate (PEM), for daemons that require one; or null
   * @param clientKey its PKCS#8 private key (PEM); or null
   * @param bearerToken sent as {@code authorization: Bearer <token>} on every call; or null
   */
  public record Security(Path caCert, Path clientCert, Path clientKey, String bearerToken) {
    /** Plaintext, no token: the Unix socket and loopback TCP, where the kernel identifies the client. */
    public static final Security NONE = new Security(null, null, null, null);

    public Security {
      if ((clientCert == null) != (clientKey == null)) {
        throw new IllegalArgumentException("tls: a client certificate needs its key and a key its certificate");
      }
      if (clientCert != null && caCert == null) {
        throw new IllegalArgumentException("tls: a client certificate needs TLS (expected: the daemon's CA too)");
      }
      if (bearerToken != null && (bearerToken.isEmpty() || !bearerToken.chars().allMatch(c -> c > 0x20 && c < 0x7f))) {
        throw new IllegalArgumentException("bearer token: printable ASCII without blanks (expected: the token as "
            + "the daemon's --tokens-file lists it)");
      }
    }

    public boolean tls() {
      return caCert != null;
    }
  }

  /** A channel and the event loop it owns; closing it shuts down both. */
  public static final class Connection implements AutoCloseable {
    private final MovingChannel channel;
    private final EventLoopGroup group;
    private final String target;

    Connection(MovingChannel channel, EventLoopGroup group, String target) {
      this.channel = channel;
      this.group = group;
      this.target = target;
    }

    public ManagedChannel channel() {
      return channel;
    }

    /** The same channel, with what a take-over asks of it. */
    MovingChannel moving() {
      return channel;
    }

    public String target() {
      return target;
    }

    @Override
    public void close() {
      channel.shutdown();
      try {
        if (!channel.awaitTermination(2, TimeUnit.SECONDS)) {
          channel.shutdownNow();
        }
      } catch (InterruptedException e) {
        channel.shutdownNow();
        Thread.currentThread().interrupt();
      }
      group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    }
  }

  /**
   * @param target {@code unix:///path/to.sock} or {@code host:port}
   * @throws IllegalArgumentException for a target of another form
   */
  public static Connection open(String target) {
    return open(target, Security.NONE);
  }

  /**
   * @param target {@code unix:///path/to.sock} or {@code host:port}
   * @param security TLS (TCP only) and a bearer token
   * @throws IllegalArgumentException for a target of another form, TLS on a Unix socket, or a
   *     TLS file that cannot be read
   */
  public static Connection open(String target, Security security) {
    if (security.tls() && target.startsWith("unix://")) {
      throw new IllegalArgumentException("target: " + target + " is a Unix socket, which is never TLS "
          + "(expected: host:port for TLS, or no TLS files)");
    }
    ChannelCredentials credentials = security.tls() ? tlsCredentials(security) : null;
    EventLoopGroup group = new EpollEventLoopGroup(1, daemon("gpumemd-client"));
    NettyChannelBuilder builder;
    Path socket = null;
    if (target.startsWith("unix://")) {
      String path = target.substring("unix://".length());
      if (path.isEmpty()) {
        throw new IllegalArgumentException("target: " + target + " (expected: unix:///path/to.sock)");
      }
      socket = Path.of(path);
      builder = unix(socket);
    } else {
      int colon = target.lastIndexOf(':');
      if (colon <= 0 || target.contains("/")) {
        group.shutdownGracefully(0, 0, TimeUnit.SECONDS);
        throw new IllegalArgumentException("target: " + target + " (expected: unix:///path/to.sock or host:port)");
      }
      int port;
      try {
        port = Integer.parseInt(target.substring(colon + 1));
      } catch (NumberFormatException e) {
        group.shutdownGracefully(0, 0, TimeUnit.SECONDS);
        throw new IllegalArgumentException("target: " + target + " (expected: host:port with a numeric port)");
      }
      String host = target.substring(0, colon);
      builder = (credentials != null ? NettyChannelBuilder.forAddress(host, port, credentials)
          : NettyChannelBuilder.forAddress(host, port).usePlaintext())
          .channelType(EpollSocketChannel.class);
    }
    MovingChannel channel = new MovingChannel(build(builder, security, group), socket,
        successor -> build(unix(successor), security, group));
    return new Connection(channel, group, target);
  }

  /** A plaintext builder for a Unix socket (never TLS: the kernel vouches for its peers). */
  private static NettyChannelBuilder unix(Path socket) {
    return NettyChannelBuilder.forAddress(new DomainSocketAddress(socket.toString()))
        .channelType(EpollDomainSocketChannel.class)
        // grpc-netty sets SO_KEEPALIVE on every channel; a Unix socket has no such option and
        // Netty logs a warning per connection. A null value removes the option.
        .withOption(ChannelOption.SO_KEEPALIVE, null)
        .usePlaintext();
  }

  /**
   * The channel of {@code builder} on the connection's event loop, with the settings every
   * channel of the client has (a successor's spare too, {@link MovingChannel}); the moving retry
   * is the {@link MovingChannel}'s, above them all.
   */
  private static ManagedChannel build(NettyChannelBuilder builder, Security security, EventLoopGroup group) {
    if (security.bearerToken() != null) {
      builder.intercept(bearer(security.bearerToken()));
    }
    return builder.eventLoopGroup(group)
        .directExecutor()
        // gRPC's retry machinery wraps every call in a RetriableStream that buffers its messages
        // for replay; gpumemd configures no retry policy, so it would only ever replay a call
        // that never reached the daemon during a connection race. The daemon is local and has
        // no other replica to retry on; measured (gpumemctl loadgen, 2-core VM): without it 64
        // async pairs in flight run ~20% faster and a blocking pair's p50 drops ~8%.
        .disableRetry()
        .build();
  }

  private static ChannelCredentials tlsCredentials(Security security) {
    TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
    try {
      tls.trustManager(security.caCert().toFile());
    } catch (IOException | RuntimeException e) {
      throw new IllegalArgumentException("tls-ca: " + security.caCert() + " (expected: a readable PEM CA certificate; "
          + e.getMessage() + ")");
    }
    if (security.clientCert() != null) {
      try {
        tls.keyManager(security.clientCert().toFile(), security.clientKey().toFile());
      } catch (IOException | RuntimeException e) {
        throw new IllegalArgumentException("tls-cert: " + security.clientCert() + " with tls-key: " + security.clientKey()
            + " (expected: a readable PEM certificate and its PKCS#8 key; " + e.getMessage() + ")");
      }
    }
    return tls.build();
  }

  /** Adds {@code authorization: Bearer <token>} to every call, streams included. */
  private static ClientInterceptor bearer(String token) {
    String value = "Bearer " + token;
    return new ClientInterceptor() {
      @Override
      public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
        return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
          @Override
          public void start(Listener<R> listener, Metadata headers) {
            headers.put(AUTHORIZATION, value);
            super.start(listener, headers);
          }
        };
      }
    };
  }

  private static ThreadFactory daemon(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }
}
