package io.gpumemd.it.takeover;

import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import java.io.EOFException;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;

/**
 * The test's own end of a take-over connection, speaking the frames by hand (a 4-byte
 * big-endian length, then a {@link TakeOverFrame}): what a broken or hostile peer would send.
 * Descriptors that come with a frame are dropped by the kernel (no control buffer here). Not
 * thread-safe.
 */
final class TakeOverPeer implements AutoCloseable {
  private final SocketChannel channel;

  private TakeOverPeer(SocketChannel channel) {
    this.channel = channel;
  }

  static TakeOverPeer connect(Path socket) throws IOException {
    SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX);
    c.connect(UnixDomainSocketAddress.of(socket));
    return new TakeOverPeer(c);
  }

  static TakeOverPeer of(SocketChannel channel) {
    return new TakeOverPeer(channel);
  }

  /** What a host-backend successor of the test daemons says: two devices of 256 MiB. */
  static Hello hostHello() {
    return Hello.newBuilder().setVersion("test").setBackend("host").setHandles("host/descriptors")
        .addLimitBytes(256L << 20).addLimitBytes(256L << 20).setPid((int) ProcessHandle.current().pid()).build();
  }

  void writeRaw(byte[] bytes) throws IOException {
    ByteBuffer b = ByteBuffer.wrap(bytes);
    while (b.hasRemaining()) {
      channel.write(b);
    }
  }

  void send(TakeOverFrame frame) throws IOException {
    byte[] body = frame.toByteArray();
    writeRaw(ByteBuffer.allocate(4 + body.length).putInt(body.length).put(body).array());
  }

  /** The next frame, or null when the other end closed the connection. */
  TakeOverFrame receive() throws IOException {
    ByteBuffer header = ByteBuffer.allocate(4);
    if (!readFully(header, true)) {
      return null;
    }
    ByteBuffer body = ByteBuffer.allocate(header.flip().getInt());
    readFully(body, false);
    return TakeOverFrame.parseFrom(body.flip());
  }

  private boolean readFully(ByteBuffer b, boolean eofAtStartOk) throws IOException {
    while (b.hasRemaining()) {
      if (channel.read(b) < 0) {
        if (eofAtStartOk && b.position() == 0) {
          return false;
        }
        throw new EOFException("closed mid-frame");
      }
    }
    return true;
  }

  @Override
  public void close() throws IOException {
    channel.close();
  }
}
