package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.DescriptorBatch;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * One connection of the take-over socket: frames of {@code gpumemd.takeover.v1} (a 4-byte
 * big-endian length, then a {@link TakeOverFrame}), descriptors riding on {@link DescriptorBatch}
 * frames. Owns its socket and every descriptor received and not yet taken ({@link #takeFds}),
 * and closes them all at {@link #close}.
 *
 * <p>Frames are bounded by what each side can be sent: a holder hears only control frames from a
 * taker ({@link #receiveFromTaker}: at most {@link #MAX_CONTROL_BYTES}, never a descriptor), a
 * taker hears the state ({@link #receiveFromHolder}: at most {@link #MAX_STATE_BYTES}, read in
 * chunks, so an announced length costs memory only as its bytes arrive), with descriptor batches
 * of at most {@link UnixSockets#MAX_FDS_PER_FRAME} that must carry what they announce.
 *
 * <p>Not thread-safe: one thread talks on it.
 */
final class TakeOverChannel implements AutoCloseable {
  /**
   * Hello, Abort, Taken, Live, Refusal, DescriptorBatch: a few hundred bytes (a Hello names one
   * budget per device). A peer announcing more is broken or hostile, and refused before any
   * allocation.
   */
  static final int MAX_CONTROL_BYTES = 64 << 10;
  /**
   * The books of a large node are megabytes (9,310 bytes for 7 sessions and 130 leases); a
   * state beyond 256 MiB is a broken peer.
   */
  static final int MAX_STATE_BYTES = 256 << 20;

  private final int fd;
  private final ArrayDeque<Integer> received = new ArrayDeque<>();
  /** The length of the last frame received (a parsed message would compute its size again). */
  private int lastFrameBytes;
  /** When set ({@code System.nanoTime()}), every send and receive must end by then; 0: none. */
  private long deadlineNanos;
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

  /** Bounds each later send and receive call on the socket (0 = wait forever); clears a {@link #deadline}. */
  void timeout(long millis) throws IOException {
    deadlineNanos = 0;
    UnixSockets.timeouts(fd, millis);
  }

  /**
   * Every later send and receive must end by {@code nanos} ({@code System.nanoTime()}), however
   * the peer paces its bytes: what bounds a wait on a peer as a whole, not per call.
   */
  void deadline(long nanos) {
    deadlineNanos = nanos;
  }

  /** A send or receive that ended because the peer was silent past its timeout or deadline. */
  static boolean timedOut(IOException e) {
    return e instanceof UnixSockets.DeadlinePassed
        || e instanceof io.gpumemd.common.unix.ErrnoCalls.ErrnoException errno && errno.timedOut();
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
    UnixSockets.send(fd, bytes, fds, deadlineNanos);
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
   * Stops hearing the peer: its later sends fail, what it sent before can still be read. See
   * {@link UnixSockets#shutdownInput}.
   */
  void shutdownInput() throws IOException {
    UnixSockets.shutdownInput(fd);
  }

  /**
   * The holder's read: the taker's next control frame (Hello, Abort, Taken, Live). A taker sends
   * no descriptors: any that come are closed, and the frame refused.
   *
   * @throws java.io.EOFException when the peer closed the connection
   */
  TakeOverFrame receiveFromTaker() throws IOException {
    TakeOverFrame frame = receiveFrame(MAX_CONTROL_BYTES);
    if (!received.isEmpty() || frame.hasDescriptors()) {
      int count = received.size();
      received.forEach(UnixSockets::closeQuietly);
      received.clear();
      throw new IOException("the taker sent " + count + " descriptor(s) (expected: none; only the holder sends them)");
    }
    return frame;
  }

  /**
   * The taker's read: the next frame that is not a descriptor batch; descriptors that came
   * meanwhile wait for {@link #takeFds}. Each batch must carry the descriptors it announces.
   *
   * @throws java.io.EOFException when the peer closed the connection
   */
  TakeOverFrame receiveFromHolder() throws IOException {
    while (true) {
      int before = received.size();
      TakeOverFrame frame = receiveFrame(MAX_STATE_BYTES);
      int came = received.size() - before;
      if (!frame.hasDescriptors()) {
        if (came > 0) {
          throw new IOException(came + " descriptor(s) came on a " + frame.getFrameCase() + " frame (expected: "
              + "descriptors only on DescriptorBatch frames)");
        }
        return frame;
      }
      int count = frame.getDescriptors().getCount();
      if (count != came || count > UnixSockets.MAX_FDS_PER_FRAME) {
        throw new IOException("a descriptor batch announced " + count + " descriptor(s) and carried " + came
            + " (expected: the same, at most " + UnixSockets.MAX_FDS_PER_FRAME + ")");
      }
    }
  }

  /**
   * Reads one frame of at most {@code maxBytes}: a longer announced length is refused before
   * anything is allocated for it, and the body is read in chunks into an array that grows only
   * as bytes arrive (a peer that announces 256 MiB and sends 5 bytes costs a megabyte).
   */
  private TakeOverFrame receiveFrame(int maxBytes) throws IOException {
    byte[] header = new byte[4];
    UnixSockets.receive(fd, header, 0, 4, received, deadlineNanos);
    int length = ByteBuffer.wrap(header).getInt();
    lastFrameBytes = length;
    if (length < 0 || length > maxBytes) {
      throw new IOException("take-over frame of " + Integer.toUnsignedString(length) + " bytes (expected: at most "
          + maxBytes + ")");
    }
    byte[] body = new byte[Math.min(length, UnixSockets.MAX_CHUNK_BYTES)];
    int read = 0;
    while (read < length) {
      int n = Math.min(UnixSockets.MAX_CHUNK_BYTES, length - read);
      if (body.length < read + n) {
        body = Arrays.copyOf(body, (int) Math.min(length, Math.max(read + n, 2L * body.length)));
      }
      UnixSockets.receive(fd, body, read, n, received, deadlineNanos);
      read += n;
    }
    return TakeOverFrame.parseFrom(body);
  }

  /** The length in bytes of the last frame received. */
  int lastFrameBytes() {
    return lastFrameBytes;
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
