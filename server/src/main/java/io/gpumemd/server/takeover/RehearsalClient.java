package io.gpumemd.server.takeover;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.ShareRequest;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.stub.StreamObserver;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The client side of a {@link Rehearsal}: a plain gRPC client on one of this daemon's Unix
 * sockets that makes the calls a worker's client makes, each bounded by one deadline for the
 * whole rehearsal. What it leases is a scratch daemon's (or refused "moving" by a closed gate):
 * it never touches the books this daemon serves.
 *
 * <p>Not thread-safe: the starting thread uses it; stream events arrive on its own event loop
 * and wait in a queue.
 */
final class RehearsalClient implements AutoCloseable {
  /** What a worker leases most: a block that shares a segment with others. */
  static final long LEASE_BYTES = 64 << 10;
  /** The size of the leases the rehearsal's client keeps: small, since they cost scratch memory. */
  static final long HELD_BYTES = 4 << 10;
  /** Marks the end of the KeepAlive stream in {@link #events}. */
  private static final SessionEvent ENDED = SessionEvent.getDefaultInstance();

  private final EventLoopGroup loop;
  private ManagedChannel channel;
  private final Path socket;
  private final long deadlineNanos;
  private final BlockingQueue<SessionEvent> events = new LinkedBlockingQueue<>();
  private StreamObserver<KeepAliveRequest> stream;
  /** The current stream's end was read from {@link #events}. */
  private boolean ended;
  private long nextRequest;

  /** A client of the daemon's socket at {@code socket}, whose calls must all end by {@code deadlineNanos}. */
  RehearsalClient(Path socket, long deadlineNanos) {
    this.deadlineNanos = deadlineNanos;
    this.socket = socket;
    this.loop = new EpollEventLoopGroup(1, r -> {
      Thread t = new Thread(r, "gpumemd-rehearsal");
      t.setDaemon(true);
      return t;
    });
    this.channel = connect();
  }

  /** A new channel to the socket, on this client's event loop: its first call opens a connection of its own. */
  private ManagedChannel connect() {
    return NettyChannelBuilder.forAddress(new DomainSocketAddress(socket.toString()))
        .eventLoopGroup(loop).channelType(EpollDomainSocketChannel.class).usePlaintext()
        // grpc-netty sets SO_KEEPALIVE on every channel, and netty warns that a Unix socket has none
        .withOption(ChannelOption.SO_KEEPALIVE, null).build();
  }

  /** Closes the connection and opens the next one, as a client reattaching to a successor does. */
  void reconnect() throws InterruptedException {
    channel.shutdownNow();
    channel.awaitTermination(1, TimeUnit.SECONDS);
    channel = connect();
  }

  private long leftMillis() {
    return Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime()));
  }

  private AllocatorGrpc.AllocatorBlockingStub blocking() {
    return AllocatorGrpc.newBlockingStub(channel).withDeadlineAfter(leftMillis(), TimeUnit.MILLISECONDS);
  }

  /** A health check; its answer, whatever it is, means the way there and back has run. */
  void health() {
    try {
      HealthGrpc.newBlockingStub(channel).withDeadlineAfter(leftMillis(), TimeUnit.MILLISECONDS)
          .check(HealthCheckRequest.getDefaultInstance());
    } catch (StatusRuntimeException e) {
      // an answer all the same
    }
  }

  String openSession() {
    return blocking().openSession(OpenSessionRequest.newBuilder().setClientName("gpumemd-rehearsal").build())
        .getSessionId();
  }

  /** A unary lease and its release. */
  void leaseUnary(String session, int device) {
    LeaseResponse lease = blocking().lease(LeaseRequest.newBuilder().setSessionId(session).setDevice(device)
        .setSizeBytes(LEASE_BYTES).build());
    blocking().release(ReleaseRequest.newBuilder().setSessionId(session).setLeaseId(lease.getLeaseId()).build());
  }

  /** A share token for {@code leaseId}: the sharing books get an entry too. */
  void share(String session, String leaseId) {
    blocking().share(ShareRequest.newBuilder().setSessionId(session).setLeaseId(leaseId).build());
  }

  /**
   * Opens the KeepAlive stream of {@code session} and waits for the daemon to confirm it.
   *
   * @return whether it was confirmed (false: refused, e.g. "moving", or no answer in time)
   */
  boolean attach(String session) throws InterruptedException {
    ended = false;
    stream = AllocatorGrpc.newStub(channel).withDeadlineAfter(leftMillis(), TimeUnit.MILLISECONDS)
        .keepAlive(new StreamObserver<>() {
          @Override
          public void onNext(SessionEvent event) {
            events.add(event);
          }

          @Override
          public void onError(Throwable t) {
            events.add(ENDED);
          }

          @Override
          public void onCompleted() {
            events.add(ENDED);
          }
        });
    stream.onNext(KeepAliveRequest.newBuilder().setSessionId(session).build());
    SessionEvent first = next();
    return first != null && first.hasAttached();
  }

  /**
   * Leases on the stream, as a worker's client does: {@code rounds} leases on {@code device},
   * each released once answered, then {@code held} more of {@value #HELD_BYTES} bytes that are kept.
   *
   * @return the held leases' ids, or null when the stream ended or the time ran out
   */
  List<String> leaseOnStream(int device, int rounds, int held) throws InterruptedException {
    List<String> kept = new ArrayList<>(held);
    for (int i = 0; i < rounds + held; i++) {
      long id = ++nextRequest;
      stream.onNext(KeepAliveRequest.newBuilder().addLeases(StreamLease.newBuilder().setRequestId(id)
          .setDevice(device).setSizeBytes(i < rounds ? LEASE_BYTES : HELD_BYTES)).build());
      SessionEvent reply;
      do {
        reply = next();
        if (reply == null) {
          return null;
        }
      } while (!reply.hasLeaseReply() || reply.getLeaseReply().getRequestId() != id);
      if (!reply.getLeaseReply().hasLease()) {
        return null;
      }
      String lease = reply.getLeaseReply().getLease().getLeaseId();
      if (i < rounds) {
        stream.onNext(KeepAliveRequest.newBuilder().addReleases(StreamRelease.newBuilder().setLeaseId(lease)).build());
      } else {
        kept.add(lease);
      }
    }
    return kept;
  }

  /** Reads the stream until the daemon says the session moved (true), or the stream ends or the time runs out. */
  boolean awaitMoving() throws InterruptedException {
    for (SessionEvent e = next(); e != null; e = next()) {
      if (e.hasMoving()) {
        return true;
      }
    }
    return false;
  }

  /** Ends the KeepAlive stream (the session stays until its TTL, as a client's that went away). */
  void detach() throws InterruptedException {
    if (stream != null) {
      stream.onCompleted();
      stream = null;
      while (!ended && next() != null) {
        // events of the stream's last moments: nobody waits for them
      }
    }
  }

  /** The stream's next event; null when it ended or the time ran out. */
  private SessionEvent next() throws InterruptedException {
    SessionEvent e = events.poll(Math.max(0, deadlineNanos - System.nanoTime()), TimeUnit.NANOSECONDS);
    if (e == ENDED) {
      ended = true;
      return null;
    }
    return e;
  }

  @Override
  public void close() throws InterruptedException {
    channel.shutdownNow();
    channel.awaitTermination(1, TimeUnit.SECONDS);
    loop.shutdownGracefully(0, 1, TimeUnit.SECONDS);
  }
}
