package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.CloseSessionResponse;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.MovingNotice;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamAttached;
import io.gpumemd.proto.v1.SuccessorNotice;
import io.grpc.Attributes;
import io.grpc.Server;
import io.grpc.ServerTransportFilter;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.stub.StreamObserver;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A take-over as the client sees it, with two real gRPC servers on Unix sockets in this process:
 * the "old daemon" at the client's target tells the session's stream where its successor
 * listens (a {@code SuccessorNotice} naming a socket beside the target), the successor moves its
 * socket over the target's path (as a successor's publish does), and the old daemon sends the
 * MovingNotice and ends the stream, with no GOAWAY. The client connects to the successor when it
 * is told, before the move, and reattaches over that connection: the successor has one
 * connection when the stream comes, and a second (the client's primary channel, back at the
 * target) only after the stream attached. Told a socket that is not there, the client reattaches
 * over a new connection to the target, as before.
 */
class MovingSpareTest {
  private static final String SESSION = CraftedDaemon.SESSION;
  private static final String SUCCESSOR = "gpumemd.sock.new-4242";

  @TempDir
  Path dir;

  private final EventLoopGroup group = new EpollEventLoopGroup(2);
  private Path target;
  private Daemon old;
  private Daemon successor;

  @BeforeEach
  void start() throws Exception {
    target = dir.resolve("gpumemd.sock");
    old = new Daemon(target);
    successor = new Daemon(dir.resolve(SUCCESSOR));
  }

  @AfterEach
  void stop() throws InterruptedException {
    old.server.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
    successor.server.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
    group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
  }

  @Test
  void toldWhereTheSuccessorListens_theClientConnectsBeforeTheMove_andReattachesOverThatConnection() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect("unix://" + target)) {
      StreamObserver<SessionEvent> first = toldWhereTheSuccessorListens();
      assertEquals(0, successor.streamsSeen.get(), "nothing is called there before the move");

      move(first);

      assertNotNull(successor.streams.poll(10, TimeUnit.SECONDS), "the client did not reattach at the successor");
      assertEquals(1, successor.connectionsAtFirstStream.get(), "the reattach did not come over the connection "
          + "made before the move");
      assertTrue(await(() -> successor.connections.get() == 2), "the primary channel did not reconnect to the target");
      assertEquals(SESSION, client.sessionId(), "the session moved, it was not opened again");
      assertEquals(1, old.streamsSeen.get());
    }
  }

  @Test
  void toldASocketThatIsNotThere_theClientReattachesOverANewConnectionToItsTarget() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect("unix://" + target)) {
      StreamObserver<SessionEvent> first = old.streams.poll(10, TimeUnit.SECONDS);
      assertNotNull(first, "the session's first KeepAlive stream");
      first.onNext(SessionEvent.newBuilder().setSuccessor(SuccessorNotice.newBuilder()
          .setSocketName("gpumemd.sock.new-1")).build());
      // Nothing listens there; a name with a slash is not even looked for.
      first.onNext(SessionEvent.newBuilder().setSuccessor(SuccessorNotice.newBuilder()
          .setSocketName("../elsewhere.sock")).build());
      Thread.sleep(200);
      assertEquals(0, successor.connections.get());

      move(first);

      assertNotNull(successor.streams.poll(10, TimeUnit.SECONDS), "the client did not reattach at the successor");
      assertEquals(1, successor.connectionsAtFirstStream.get());
      assertEquals(SESSION, client.sessionId());
    }
  }

  @Test
  void toldTheSuccessorWentAway_theClientDropsItsConnectionThere_andMovesAsWithout() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect("unix://" + target)) {
      StreamObserver<SessionEvent> first = toldWhereTheSuccessorListens();

      // An empty name: that successor went away without taking over (its hand-over was given up).
      first.onNext(SessionEvent.newBuilder().setSuccessor(SuccessorNotice.getDefaultInstance()).build());

      assertTrue(await(() -> successor.disconnections.get() == 1), "the client kept its connection to the successor");
      // A later successor (here the same server, as the target) is reached over a new connection.
      move(first);
      assertNotNull(successor.streams.poll(10, TimeUnit.SECONDS), "the client did not reattach at the successor");
      assertEquals(2, successor.connectionsAtFirstStream.get(), "the reattach came over the dropped connection");
      assertEquals(SESSION, client.sessionId());
    }
  }

  /** The old daemon's first stream, on which it named the successor, once the client connected there. */
  private StreamObserver<SessionEvent> toldWhereTheSuccessorListens() throws InterruptedException {
    StreamObserver<SessionEvent> first = old.streams.poll(10, TimeUnit.SECONDS);
    assertNotNull(first, "the session's first KeepAlive stream");
    first.onNext(SessionEvent.newBuilder().setSuccessor(SuccessorNotice.newBuilder().setSocketName(SUCCESSOR))
        .build());
    assertTrue(await(() -> successor.connections.get() == 1), "the client did not connect to the successor");
    return first;
  }

  /** The successor takes the target's path (as its publish renames its socket), then the old daemon says so. */
  private void move(StreamObserver<SessionEvent> stream) throws Exception {
    Files.move(dir.resolve(SUCCESSOR), target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    stream.onNext(SessionEvent.newBuilder().setMoving(MovingNotice.getDefaultInstance()).build());
    stream.onCompleted();
  }

  private static boolean await(java.util.function.BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        return false;
      }
      Thread.sleep(5);
    }
    return true;
  }

  /**
   * A gRPC server on a Unix socket that opens one session and attaches every KeepAlive stream
   * (the successor as the session's), counting its connections; the test drives the streams.
   */
  private final class Daemon extends AllocatorGrpc.AllocatorImplBase {
    final Server server;
    final AtomicInteger connections = new AtomicInteger();
    final AtomicInteger disconnections = new AtomicInteger();
    final AtomicInteger streamsSeen = new AtomicInteger();
    final AtomicInteger connectionsAtFirstStream = new AtomicInteger(-1);
    final BlockingQueue<StreamObserver<SessionEvent>> streams = new LinkedBlockingQueue<>();

    Daemon(Path socket) throws Exception {
      server = NettyServerBuilder.forAddress(new DomainSocketAddress(socket.toString()))
          .channelType(EpollServerDomainSocketChannel.class).bossEventLoopGroup(group).workerEventLoopGroup(group)
          .directExecutor()
          .addTransportFilter(new ServerTransportFilter() {
            @Override
            public Attributes transportReady(Attributes attributes) {
              connections.incrementAndGet();
              return attributes;
            }

            @Override
            public void transportTerminated(Attributes attributes) {
              disconnections.incrementAndGet();
            }
          })
          .addService(this).build().start();
    }

    @Override
    public void openSession(OpenSessionRequest request, StreamObserver<OpenSessionResponse> response) {
      CraftedDaemon.openSession(response);
    }

    @Override
    public StreamObserver<KeepAliveRequest> keepAlive(StreamObserver<SessionEvent> events) {
      if (streamsSeen.getAndIncrement() == 0) {
        connectionsAtFirstStream.set(connections.get());
      }
      return new StreamObserver<>() {
        private boolean hello = true;

        @Override
        public void onNext(KeepAliveRequest message) {
          if (hello) {
            hello = false;
            events.onNext(SessionEvent.newBuilder()
                .setAttached(StreamAttached.newBuilder().setSessionId(SESSION).setAppliedMessages(0)).build());
            streams.add(events);
          }
        }

        @Override
        public void onError(Throwable t) {}

        @Override
        public void onCompleted() {}
      };
    }

    @Override
    public void closeSession(CloseSessionRequest request, StreamObserver<CloseSessionResponse> response) {
      response.onNext(CloseSessionResponse.getDefaultInstance());
      response.onCompleted();
    }
  }
}
