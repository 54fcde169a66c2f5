package io.gpumemd.client;

import com.sun.jna.Library;
import com.sun.jna.Native;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.AttachResponse;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.CloseSessionResponse;
import io.gpumemd.proto.v1.FdGrant;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRefusal;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseReply;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.ReleaseResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamAttached;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.bootstrap.ServerBootstrap;
import io.grpc.netty.shaded.io.netty.buffer.ByteBuf;
import io.grpc.netty.shaded.io.netty.buffer.ByteBufUtil;
import io.grpc.netty.shaded.io.netty.channel.Channel;
import io.grpc.netty.shaded.io.netty.channel.ChannelHandlerContext;
import io.grpc.netty.shaded.io.netty.channel.ChannelInboundHandlerAdapter;
import io.grpc.netty.shaded.io.netty.channel.ChannelInitializer;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import io.grpc.netty.shaded.io.netty.handler.codec.LengthFieldBasedFrameDecoder;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.UnaryOperator;

/**
 * A daemon that says what a test makes it say: a real gRPC server (loopback TCP, in this
 * process) whose Lease, stream lease, Attach and Lookup answer with {@link #reply}'s crafted
 * {@link LeaseResponse}, and a real fd channel (a Unix socket, {@link #fdSocket}) that grants
 * every request with {@link #grantBytes} and sends a real memfd of {@link #fileBytes} bytes as
 * the descriptor. It keeps no books: it records the lease ids released ({@link #awaitReleased})
 * so that a test can see a client give back what it refused.
 *
 * <p>Thread-safe as far as tests need: the crafted values are volatile, the records concurrent
 * or guarded by their own monitor.
 */
final class CraftedDaemon implements AutoCloseable {
  static final String SESSION = "0123456789abcdef0123456789abcdef";

  /** The libc calls that make a real anonymous file: memfd_create and ftruncate. */
  interface MemfdLibc extends Library {
    MemfdLibc C = Native.load("c", MemfdLibc.class);

    int memfd_create(String name, int flags);

    int ftruncate(int fd, long length);

    int close(int fd);
  }

  /** Makes the reply to a lease (the request's device and size) or to an attach (-1, 0). */
  interface Replies {
    LeaseResponse reply(int device, long sizeBytes);
  }

  volatile Replies reply;
  /** segment_bytes of the fd channel's grant. */
  volatile long grantBytes;
  /** Size of the memfd sent with each grant. */
  volatile long fileBytes;
  /** Grants read-only whatever was asked (a session that holds only read-only holds there). */
  volatile boolean grantReadOnly;
  /** Lease ids released: by the Release call or by a release notice on the stream. */
  private final List<String> released = new ArrayList<>(); // guarded by itself
  /** The size of each memfd sent over the fd channel. */
  final List<Long> sentFiles = new CopyOnWriteArrayList<>();

  final Path fdSocket;
  private final Server server;
  private final EpollEventLoopGroup fdGroup = new EpollEventLoopGroup(1);
  private final Channel fdServer;

  CraftedDaemon(Path dir) throws IOException, InterruptedException {
    this.fdSocket = dir.resolve("crafted.sock.fd");
    server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0)).directExecutor()
        .addService(new Allocator()).build().start();
    fdServer = new ServerBootstrap().group(fdGroup).channel(EpollServerDomainSocketChannel.class)
        .childHandler(new ChannelInitializer<EpollDomainSocketChannel>() {
          @Override
          protected void initChannel(EpollDomainSocketChannel connection) {
            connection.pipeline().addLast(new LengthFieldBasedFrameDecoder(4 + 4096, 0, 4, 0, 4, true))
                .addLast(new FdAnswers());
          }
        })
        .bind(new DomainSocketAddress(fdSocket.toString())).sync().channel();
  }

  private void released(String leaseId) {
    synchronized (released) {
      released.add(leaseId);
      released.notifyAll();
    }
  }

  /**
   * True once {@code leaseId} is released; waits for it, since a client gives back a lease it
   * refused without waiting (a notice, or a call nobody waits for). The bound only ends a test
   * that would otherwise hang.
   */
  boolean awaitReleased(String leaseId) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    synchronized (released) {
      while (!released.contains(leaseId)) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return false;
        }
        TimeUnit.NANOSECONDS.timedWait(released, left);
      }
      return true;
    }
  }

  /** The gRPC target of the crafted daemon. */
  String target() {
    return "127.0.0.1:" + server.getPort();
  }

  /** A well-formed reply: {@code sizeBytes} at {@code offset} of a segment of {@code segmentBytes}. */
  static LeaseResponse.Builder lease(String id, int device, long sizeBytes, long blockBytes, long segmentId,
      long segmentBytes, long offset) {
    LeaseResponse.Builder b = LeaseResponse.newBuilder().setLeaseId(id).setDevice(device).setSizeBytes(sizeBytes)
        .setBlockBytes(blockBytes);
    b.getHandleBuilder().setSegmentId(segmentId).setSegmentBytes(segmentBytes).setOffset(offset);
    return b;
  }

  /** Replies with {@code base} edited by {@code edit}, whatever was asked. */
  void replyWith(LeaseResponse.Builder base, UnaryOperator<LeaseResponse.Builder> edit) {
    LeaseResponse response = edit.apply(base.clone()).build();
    reply = (device, size) -> response;
  }

  @Override
  public void close() throws InterruptedException {
    server.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
    fdServer.close().sync();
    fdGroup.shutdownGracefully(0, 1, TimeUnit.SECONDS).sync();
  }

  /** Opens the one session {@link #SESSION}, without a client cache tier, whatever was asked. */
  static void openSession(StreamObserver<OpenSessionResponse> response) {
    // client_cache_bytes 0: no client cache tier, so a close is a release this daemon sees
    response.onNext(OpenSessionResponse.newBuilder().setSessionId(SESSION).setTtlSeconds(60)
        .setKeepaliveGraceMs(60_000).setClientCacheBytes(0).build());
    response.onCompleted();
  }

  private final class Allocator extends AllocatorGrpc.AllocatorImplBase {
    @Override
    public void openSession(OpenSessionRequest request, StreamObserver<OpenSessionResponse> response) {
      CraftedDaemon.openSession(response);
    }

    @Override
    public StreamObserver<KeepAliveRequest> keepAlive(StreamObserver<SessionEvent> events) {
      return new StreamObserver<>() {
        private boolean attached;

        @Override
        public void onNext(KeepAliveRequest message) {
          synchronized (events) {
            if (!attached) {
              attached = true;
              events.onNext(SessionEvent.newBuilder().setAttached(StreamAttached.newBuilder().setSessionId(SESSION)
                  .setAppliedMessages(0)).build());
            }
            for (StreamRelease r : message.getReleasesList()) {
              released(r.getLeaseId());
            }
            for (StreamLease lease : message.getLeasesList()) {
              events.onNext(SessionEvent.newBuilder().setLeaseReply(LeaseReply.newBuilder()
                  .setRequestId(lease.getRequestId()).setLease(reply.reply(lease.getDevice(), lease.getSizeBytes())))
                  .build());
            }
          }
        }

        @Override
        public void onError(Throwable t) {}

        @Override
        public void onCompleted() {
          synchronized (events) {
            events.onCompleted();
          }
        }
      };
    }

    @Override
    public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
      response.onNext(reply.reply(request.getDevice(), request.getSizeBytes()));
      response.onCompleted();
    }

    @Override
    public void release(ReleaseRequest request, StreamObserver<ReleaseResponse> response) {
      released(request.getLeaseId());
      response.onNext(ReleaseResponse.getDefaultInstance());
      response.onCompleted();
    }

    @Override
    public void attach(AttachRequest request, StreamObserver<AttachResponse> response) {
      response.onNext(AttachResponse.newBuilder().setLease(reply.reply(-1, 0)).setHolds(2).build());
      response.onCompleted();
    }

    @Override
    public void lookup(LookupRequest request, StreamObserver<AttachResponse> response) {
      response.onNext(AttachResponse.newBuilder().setLease(reply.reply(-1, 0)).setHolds(2).build());
      response.onCompleted();
    }

    @Override
    public void closeSession(CloseSessionRequest request, StreamObserver<CloseSessionResponse> response) {
      response.onNext(CloseSessionResponse.getDefaultInstance());
      response.onCompleted();
    }
  }

  /**
   * One fd channel connection: each request granted with a fresh memfd of {@link #fileBytes}, a
   * bind refused as a daemon from before pushed descriptors refuses it.
   */
  private final class FdAnswers extends ChannelInboundHandlerAdapter {
    @Override
    public void channelRead(ChannelHandlerContext ctx, Object msg) throws Exception {
      FdRequest request;
      ByteBuf frame = (ByteBuf) msg;
      try {
        request = FdRequest.parseFrom(ByteBufUtil.getBytes(frame));
      } finally {
        frame.release();
      }
      if (request.getBind()) {
        // as a daemon from before pushes answers a bind: a request for segment 0, which it refuses
        byte[] refused = FdReply.newBuilder().setRequestId(request.getRequestId()).setRefused(FdRefusal.newBuilder()
            .setCode(5).setMessage("segment 0: the session holds no lease or hold in it")).build().toByteArray();
        ctx.writeAndFlush(ctx.alloc().buffer(4 + refused.length).writeInt(refused.length).writeBytes(refused));
        return;
      }
      int fd = MemfdLibc.C.memfd_create("crafted-segment", 0);
      if (fd < 0 || MemfdLibc.C.ftruncate(fd, fileBytes) != 0) {
        throw new IOException("memfd_create/ftruncate failed: errno " + Native.getLastError());
      }
      sentFiles.add(fileBytes);
      byte[] reply = FdReply.newBuilder().setRequestId(request.getRequestId()).setGranted(FdGrant.newBuilder()
          .setSegmentId(request.getSegmentId()).setSegmentBytes(grantBytes).setReadOnly(request.getReadOnly() || grantReadOnly))
          .build().toByteArray();
      ctx.write(ctx.alloc().buffer(4 + reply.length).writeInt(reply.length).writeBytes(reply));
      // the kernel gives the peer a descriptor of its own when the byte is sent: ours closes then
      ctx.writeAndFlush(new FileDescriptor(fd)).addListener(f -> MemfdLibc.C.close(fd));
    }
  }
}
