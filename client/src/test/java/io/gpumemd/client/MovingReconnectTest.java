package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.CloseSessionResponse;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.MovingNotice;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamAttached;
import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.Grpc;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * After the daemon's MovingNotice the client reattaches its session on a new connection at once,
 * whether or not the old daemon's GOAWAY came first: a daemon moving to its successor can get its
 * notice to the client before its GOAWAY (the two are sent from different threads, the GOAWAY
 * only once its listening socket is closed), and a stream opened meanwhile on the old connection
 * would reach the old daemon and be refused. The daemon here is a real gRPC server in this
 * process that sends the notice and ends the stream, and never a GOAWAY.
 */
class MovingReconnectTest {
  private static final String SESSION = CraftedDaemon.SESSION;
  private static final Context.Key<SocketAddress> PEER = Context.key("peer");

  /** Where each KeepAlive stream came from (the client's end of its connection), in order. */
  private final BlockingQueue<SocketAddress> streams = new LinkedBlockingQueue<>();
  /** KeepAlive streams opened so far (the test takes {@link #streams}' entries as they come). */
  private final AtomicInteger opened = new AtomicInteger();
  private Server server;

  @BeforeEach
  void start() throws Exception {
    ServerInterceptor peer = new ServerInterceptor() {
      @Override
      public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
          ServerCallHandler<Q, R> next) {
        Context context = Context.current().withValue(PEER, call.getAttributes().get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR));
        return Contexts.interceptCall(context, call, headers, next);
      }
    };
    server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0)).directExecutor()
        .addService(ServerInterceptors.intercept(new Moving(), peer)).build().start();
  }

  @AfterEach
  void stop() throws InterruptedException {
    server.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
  }

  @Test
  void movingNotice_reattachesOnANewConnection_withoutWaitingForAGoaway() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect("127.0.0.1:" + server.getPort())) {
      SocketAddress first = streams.poll(10, TimeUnit.SECONDS);
      assertNotNull(first, "the session's first KeepAlive stream");
      SocketAddress second = streams.poll(10, TimeUnit.SECONDS);
      assertNotNull(second, "the client reattached after the MovingNotice");
      assertNotEquals(first, second, "the reattach went on the old daemon's connection");
      assertEquals(SESSION, client.sessionId(), "the session moved, it was not opened again");
    }
  }

  /** Opens one session; its first stream is told that the session moves, and ended; later ones are attached. */
  private final class Moving extends AllocatorGrpc.AllocatorImplBase {
    @Override
    public void openSession(OpenSessionRequest request, StreamObserver<OpenSessionResponse> response) {
      CraftedDaemon.openSession(response);
    }

    @Override
    public StreamObserver<KeepAliveRequest> keepAlive(StreamObserver<SessionEvent> events) {
      SocketAddress from = PEER.get();
      boolean moves = opened.getAndIncrement() == 0;
      streams.add(from);
      return new StreamObserver<>() {
        private boolean hello = true;
        private boolean ended;

        @Override
        public void onNext(KeepAliveRequest message) {
          if (!hello) {
            return;
          }
          hello = false;
          events.onNext(SessionEvent.newBuilder()
              .setAttached(StreamAttached.newBuilder().setSessionId(SESSION).setAppliedMessages(0)).build());
          if (moves) {
            events.onNext(SessionEvent.newBuilder().setMoving(MovingNotice.getDefaultInstance()).build());
            end();
          }
        }

        @Override
        public void onError(Throwable t) {}

        @Override
        public void onCompleted() {
          end();
        }

        // Stream events come one at a time (directExecutor, one connection's event loop).
        private void end() {
          if (!ended) {
            ended = true;
            events.onCompleted();
          }
        }
      };
    }

    @Override
    public void closeSession(CloseSessionRequest request, StreamObserver<CloseSessionResponse> response) {
      response.onNext(CloseSessionResponse.getDefaultInstance());
      response.onCompleted();
    }
  }
}
