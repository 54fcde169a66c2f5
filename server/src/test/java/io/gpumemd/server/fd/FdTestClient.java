package io.gpumemd.server.fd;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import io.grpc.netty.shaded.io.netty.channel.unix.Socket;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;

/**
 * A client of the fd channel for tests, as a process of another language would speak it: frames
 * out; each reply's frame read with reads of exactly its length, and after a granted one the
 * byte with the descriptor received with {@code recvmsg} and room for one (Netty's {@code
 * Socket.recvFd}). Netty's socket does not block, so reads poll
 * with a short sleep, for at most 10 s. One thread at a time.
 */
public final class FdTestClient implements AutoCloseable {
  private static final long DEADLINE_NANOS = 10_000_000_000L;

  private final Socket socket;

  /** A reply, and the descriptor it carried (-1 for none); the test closes the descriptor. */
  public record Reply(FdReply reply, int fd) {}

  public FdTestClient(Path path) throws IOException {
    Epoll.ensureAvailability();
    socket = Socket.newSocketDomain();
    socket.connect(new DomainSocketAddress(path.toString()));
  }

  public void send(FdRequest request) throws IOException {
    byte[] body = request.toByteArray();
    ByteBuffer frame = ByteBuffer.allocateDirect(4 + body.length).putInt(body.length).put(body);
    sendRaw(frame.flip());
  }

  /**
   * Writes bytes as they are (a malformed frame, say).
   *
   * @throws IOException also when the socket takes nothing for 2 s (the daemon reads no more)
   */
  void sendRaw(ByteBuffer bytes) throws IOException {
    ByteBuffer direct = bytes.isDirect() ? bytes : ByteBuffer.allocateDirect(bytes.remaining()).put(bytes).flip();
    long deadline = System.nanoTime() + 2_000_000_000L;
    while (direct.hasRemaining()) {
      int written = socket.write(direct, direct.position(), direct.limit());
      if (written == 0) {
        pause(deadline);
      }
      direct.position(direct.position() + written);
    }
  }

  /**
   * Writes as much of {@code bytes} as the socket takes now, without waiting: what a peer that
   * floods the daemon and never reads does.
   *
   * @return the bytes written
   */
  int offer(ByteBuffer bytes) throws IOException {
    ByteBuffer direct = bytes.isDirect() ? bytes : ByteBuffer.allocateDirect(bytes.remaining()).put(bytes).flip();
    int total = 0;
    while (direct.hasRemaining()) {
      int written = socket.write(direct, direct.position(), direct.limit());
      if (written <= 0) {
        break;
      }
      direct.position(direct.position() + written);
      total += written;
    }
    return total;
  }

  /** Bytes waiting to be read now, without waiting for more ({@code FIONREAD}). */
  public int readable() throws IOException {
    return io.gpumemd.common.unix.UnixSockets.readable(socket.intValue());
  }

  /** The next reply, or null when the daemon closed the connection instead. */
  public Reply receive() throws IOException {
    long deadline = System.nanoTime() + DEADLINE_NANOS;
    ByteBuffer length = readExactly(4, deadline);
    ByteBuffer body = length == null ? null : readExactly(length.getInt(0), deadline);
    if (body == null) {
      return null;
    }
    byte[] bytes = new byte[body.remaining()];
    body.get(bytes);
    FdReply reply = FdReply.parseFrom(bytes);
    if (reply.getResultCase() != FdReply.ResultCase.GRANTED) {
      return new Reply(reply, -1);
    }
    // recvFd: > 0 the descriptor; 0 nothing yet; -1 the end of the stream (or a byte without one).
    int fd;
    while ((fd = socket.recvFd()) == 0) {
      pause(deadline);
    }
    if (fd < 0) {
      throw new IOException("a granted reply without its descriptor");
    }
    return new Reply(reply, fd);
  }

  /** True once the daemon has closed the connection (nothing more to read), within 10 s. */
  public boolean closedByDaemon() throws IOException {
    long deadline = System.nanoTime() + DEADLINE_NANOS;
    ByteBuffer one = ByteBuffer.allocateDirect(1);
    while (true) {
      int read;
      try {
        read = socket.read(one, 0, 1);
      } catch (IOException e) {
        return true; // reset
      }
      if (read < 0) {
        return true;
      }
      if (read > 0) {
        return false;
      }
      pause(deadline);
    }
  }

  private ByteBuffer readExactly(int n, long deadline) throws IOException {
    ByteBuffer buffer = ByteBuffer.allocateDirect(n);
    while (buffer.hasRemaining()) {
      int read = socket.read(buffer, buffer.position(), buffer.limit());
      if (read < 0) {
        return null;
      }
      if (read == 0) {
        pause(deadline);
      }
      buffer.position(buffer.position() + read);
    }
    return buffer.flip();
  }

  private static void pause(long deadline) throws IOException {
    if (System.nanoTime() > deadline) {
      throw new IOException("the fd channel made no progress in time");
    }
    try {
      Thread.sleep(1);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted", e);
    }
  }

  public static void closeQuietly(int fd) {
    if (fd > 0) {
      try {
        new FileDescriptor(fd).close();
      } catch (IOException e) {
        // a test's cleanup
      }
    }
  }

  @Override
  public void close() throws IOException {
    socket.close();
  }
}
