package io.gpumemd.server.takeover;

import io.gpumemd.proto.takeover.v1.DescriptorBatch;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * One connection of the take-over socket: frames of {@code gpumemd.takeover.v1} (a 4-byte
 * big-endian length, then a {@link TakeOverFrame}), descriptors riding on {@link DescriptorBatch}
 * frames. Owns its socket and every descriptor received and not yet taken ({@link #takeFds}),
 * and closes them all at {@link #close}.
 *
 * <p>Not thread-safe: one thread talks on it.
 */
final class TakeOverChannel implements AutoCloseable {
  /** The state of a large node is megabytes; a frame beyond this is a broken peer. */
  static final int MAX_FRAME_BYTES = 1 << 30;

  private final int fd;
  private final ArrayDeque<Integer> received = new ArrayDeque<>();
  private boolean closed;

  TakeOverChannel(int fd) {
    this.fd = fd;
  }

  static TakeOverChannel connect(String path, long timeoutMillis) throws IOException {
    int fd = UnixSockets.connect(path);
    TakeOverChannel channel = new TakeOverChannel(fd);
    try {
      UnixSockets.timeouts(fd, timeoutMillis);
    } catch (IOException e) {
      channel.close();
      throw e;
    }
    return channel;
  }

  int fd() {
    return fd;
  }

  void timeout(long millis) throws IOException {
    UnixSockets.timeouts(fd, millis);
  }

  /** The peer's {pid, uid, gid}. */
  int[] peer() throws IOException {
    return UnixSockets.peerCredentials(fd);
  }

  void send(TakeOverFrame frame) throws IOException {
    send(frame, List.of());
  }

  private void send(TakeOverFrame frame, List<Integer> fds) throws IOException {
    byte[] body = frame.toByteArray();
    byte[] bytes = ByteBuffer.allocate(4 + body.length).putInt(body.length).put(body).array();
    UnixSockets.send(fd, bytes, fds);
  }

  /** Sends descriptors in batches of at most {@link UnixSockets#MAX_FDS_PER_FRAME}; the caller keeps its own. */
  void sendFds(List<Integer> fds) throws IOException {
    for (int from = 0; from < fds.size(); from += UnixSockets.MAX_FDS_PER_FRAME) {
      List<Integer> batch = fds.subList(from, Math.min(fds.size(), from + UnixSockets.MAX_FDS_PER_FRAME));
      send(TakeOverFrame.newBuilder().setDescriptors(DescriptorBatch.newBuilder().setCount(batch.size())).build(),
          batch);
    }
  }

  /**
   * The next frame that is not a descriptor batch; descriptors that came meanwhile wait for
   * {@link #takeFds}.
   *
   * @throws java.io.EOFException when the peer closed the connection
   */
  TakeOverFrame receive() throws IOException {
    while (true) {
      int length = ByteBuffer.wrap(UnixSockets.receive(fd, 4, received)).getInt();
      if (length < 0 || length > MAX_FRAME_BYTES) {
        throw new IOException("take-over frame of " + length + " bytes (at most " + MAX_FRAME_BYTES + ")");
      }
      TakeOverFrame frame = TakeOverFrame.parseFrom(UnixSockets.receive(fd, length, received));
      if (!frame.hasDescriptors()) {
        return frame;
      }
    }
  }

  /** Takes the descriptors received so far; the caller owns (and closes) them from now on. */
  List<Integer> takeFds() {
    List<Integer> out = new ArrayList<>(received);
    received.clear();
    return out;
  }

  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    received.forEach(UnixSockets::closeQuietly);
    received.clear();
    UnixSockets.closeQuietly(fd);
  }
}
