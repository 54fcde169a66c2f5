package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.Taken;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.SessionRegistry;
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
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What a successor runs before it asks the running daemon for its state, so that the code of the
 * pause has been loaded and run once in this JVM: a JVM that meets the take-over's codec, its
 * channel and its clients' first calls cold spends most of the pause loading classes (measured
 * with {@code TakeOverPauseMain}: the state took 230 ms from sent to parsed, its restore 130 ms,
 * and the first reattached lease 370 ms after the old daemon stopped). Two parts, neither of
 * which serves anything or changes this daemon's books:
 *
 * <ol>
 *   <li>{@link #codec}: the state of a scratch set of pools and sessions (new and empty, on this
 *       daemon's backend and configuration) is exported, framed and sent with a descriptor over a
 *       take-over channel pair, read back, and restored into a second scratch set: the running
 *       daemon's hand-over, done here to oneself.
 *   <li>{@link #calls}: a health check, a unary Lease and a KeepAlive stream on this daemon's own
 *       Unix socket, still at its temporary path where no client finds it. The gate is closed, so
 *       the gpumemd calls are answered "moving" unapplied: what runs is the transport, the
 *       interceptors and the stream's set-up, which the clients' reattach meets first.
 * </ol>
 *
 * <p>A rehearsal that fails is logged at DEBUG and ignored: it only makes the pause shorter.
 * Stateless; run by the starting thread.
 */
public final class Rehearsal {
  private static final Logger log = LoggerFactory.getLogger(Rehearsal.class);
  /** How long the self-calls may take in all; past it the successor asks for the state anyway. */
  private static final long CALLS_MILLIS = 5_000;

  /** A scratch set of pools and sessions, new and never served. */
  public record Books(DevicePools pools, SessionRegistry registry) {}

  private Rehearsal() {}

  /**
   * Runs both parts.
   *
   * @param scratch makes a new, empty set of pools and sessions like this daemon's
   * @param channelAt where the channel pair may bind for a moment (beside the take-over socket)
   * @param socket this daemon's Unix socket as bound (its temporary path), or null without one
   */
  public static void run(Supplier<Books> scratch, Path channelAt, Path socket) {
    long started = System.nanoTime();
    try {
      codec(scratch, channelAt);
    } catch (IOException | RuntimeException e) {
      log.debug("Take-over rehearsal of the state's way failed (the pause may be longer): {}", e.toString());
    }
    long codec = System.nanoTime();
    if (socket != null) {
      try {
        calls(socket);
      } catch (RuntimeException | InterruptedException e) {
        if (e instanceof InterruptedException) {
          Thread.currentThread().interrupt();
        }
        log.debug("Take-over rehearsal of the first calls failed (the pause may be longer): {}", e.toString());
      }
    }
    log.debug("Take-over rehearsal: state's way {} ms, first calls {} ms", (codec - started) / 1_000_000,
        (System.nanoTime() - codec) / 1_000_000);
  }

  /** The hand-over of an empty state from one scratch set of books to another, over a real channel. */
  static void codec(Supplier<Books> scratch, Path channelAt) throws IOException {
    Books from = scratch.get();
    Books to = scratch.get();
    try {
      List<SegmentFd> none = new ArrayList<>();
      State state;
      try {
        state = TakeOverState.export(from.pools(), from.registry(), none);
      } catch (TakeOverRefusedException e) {
        throw new IOException(e.getMessage(), e);
      }
      State received = sendToSelf(state, channelAt);
      TakeOverState.restore(received, to.pools(), to.registry());
    } finally {
      from.pools().close();
      to.pools().close();
    }
  }

  /**
   * Sends {@code state} with one descriptor from one end of a fresh take-over channel to the
   * other, and a Taken back, as {@link HandOverAttempt} and {@link TakeOver} do; the state read.
   */
  private static State sendToSelf(State state, Path channelAt) throws IOException {
    Path at = channelAt.toAbsolutePath();
    Files.deleteIfExists(at);
    int listening = UnixSockets.listen(at.toString());
    int client;
    int server;
    try {
      client = UnixSockets.connect(at.toString(), HandOver.ANSWER_MILLIS);
      server = UnixSockets.accept(listening);
    } finally {
      UnixSockets.closeQuietly(listening);
      Files.deleteIfExists(at);
    }
    try (TakeOverChannel holder = new TakeOverChannel(server); TakeOverChannel taker = new TakeOverChannel(client)) {
      holder.timeout(HandOver.ANSWER_MILLIS);
      holder.sendFds(List.of(server)); // a descriptor rides along, as each segment's does
      holder.send(TakeOverFrame.newBuilder().setState(state.toBuilder().setDescriptorCount(1)
          .setPid((int) ProcessHandle.current().pid())).build());
      TakeOverFrame frame = taker.receiveFromHolder();
      taker.takeFds().forEach(UnixSockets::closeQuietly);
      taker.send(TakeOverFrame.newBuilder().setTaken(Taken.getDefaultInstance()).build());
      holder.receiveFromTaker();
      return frame.getState();
    }
  }

  /** A health check, a Lease and a KeepAlive message on this daemon's own socket (answered "moving"). */
  static void calls(Path socket) throws InterruptedException {
    EventLoopGroup loop = new EpollEventLoopGroup(1, r -> {
      Thread t = new Thread(r, "gpumemd-rehearsal");
      t.setDaemon(true);
      return t;
    });
    ManagedChannel channel = NettyChannelBuilder.forAddress(new DomainSocketAddress(socket.toString()))
        .eventLoopGroup(loop).channelType(EpollDomainSocketChannel.class).usePlaintext()
        // grpc-netty sets SO_KEEPALIVE on every channel, and netty warns that a Unix socket has none
        .withOption(ChannelOption.SO_KEEPALIVE, null).build();
    try {
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CALLS_MILLIS);
      try {
        HealthGrpc.newBlockingStub(channel).withDeadlineAfter(CALLS_MILLIS, TimeUnit.MILLISECONDS)
            .check(HealthCheckRequest.getDefaultInstance());
      } catch (StatusRuntimeException e) {
        // an answer all the same: the way there and back has run
      }
      try {
        AllocatorGrpc.newBlockingStub(channel).withDeadlineAfter(CALLS_MILLIS, TimeUnit.MILLISECONDS)
            .lease(LeaseRequest.newBuilder().setSessionId("rehearsal").setDevice(0).setSizeBytes(1).build());
      } catch (StatusRuntimeException e) {
        // "moving": the gate is closed until the state is here
      }
      CountDownLatch ended = new CountDownLatch(1);
      StreamObserver<KeepAliveRequest> stream = AllocatorGrpc.newStub(channel).keepAlive(new StreamObserver<>() {
        @Override
        public void onNext(SessionEvent event) {}

        @Override
        public void onError(Throwable t) {
          ended.countDown();
        }

        @Override
        public void onCompleted() {
          ended.countDown();
        }
      });
      stream.onNext(KeepAliveRequest.newBuilder().setSessionId("rehearsal").build());
      ended.await(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
      stream.onCompleted();
    } finally {
      channel.shutdownNow();
      channel.awaitTermination(1, TimeUnit.SECONDS);
      loop.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    }
  }
}
