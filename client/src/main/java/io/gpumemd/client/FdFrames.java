package io.gpumemd.client;

import com.google.protobuf.CodedOutputStream;
import com.google.protobuf.InvalidProtocolBufferException;
import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.MessageBuffer;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Arrays;

/**
 * The fd channel's framing on the client's side (see {@code gpumemd.proto} above {@code
 * FdRequest}): request frames encoded into one reused array, reply frames received into
 * another, with the descriptor of a granted reply: most often a whole reply, its descriptor's
 * byte and the descriptor in one {@code recvmsg}.
 *
 * <p>Not thread-safe: the {@link FdChannelClient}'s lock guards it.
 */
final class FdFrames {
  /** An FdReply is under 300 bytes; a longer frame is not the daemon. */
  static final int MAX_REPLY_BYTES = 1 << 16;

  /** Bytes received, of which [{@link #head}, {@link #tail}) are not read yet. */
  private byte[] received = new byte[1024];
  private int head;
  private int tail;
  /** The descriptor that came with the byte at {@code tail - 1}, not handed out yet; -1 for none. */
  private int fd = -1;
  private byte[] request = new byte[256]; // the frames being sent

  /** The frames {@link #encode} wrote, from 0. */
  byte[] request() {
    return request;
  }

  /**
   * Writes the request's frame (length, then the FdRequest), after the frame of a bind of the
   * session when {@code bindId} is not 0, into {@link #request()}, grown as needed, and returns
   * their length. Encoded field by field, as the generated code would, without
   * a builder and a message per fetch.
   */
  int encode(long bindId, long requestId, String sessionId, long segmentId, boolean readOnly)
      throws IOException {
    int at = 0;
    if (bindId != 0) {
      at = frame(0, bindId, sessionId, 0, false, true);
    }
    return frame(at, requestId, sessionId, segmentId, readOnly, false);
  }

  /** One frame at {@code at} of {@link #request()}; returns where it ends. */
  private int frame(int at, long requestId, String sessionId, long segmentId, boolean readOnly, boolean bind)
      throws IOException {
    int size = CodedOutputStream.computeUInt64Size(FdRequest.REQUEST_ID_FIELD_NUMBER, requestId)
        + (sessionId.isEmpty() ? 0 : CodedOutputStream.computeStringSize(FdRequest.SESSION_ID_FIELD_NUMBER, sessionId))
        + CodedOutputStream.computeUInt64Size(FdRequest.SEGMENT_ID_FIELD_NUMBER, segmentId)
        + (readOnly ? CodedOutputStream.computeBoolSize(FdRequest.READ_ONLY_FIELD_NUMBER, true) : 0)
        + (bind ? CodedOutputStream.computeBoolSize(FdRequest.BIND_FIELD_NUMBER, true) : 0);
    if (request.length < at + 4 + size) {
      request = Arrays.copyOf(request, at + 4 + size);
    }
    CodedOutputStream out = CodedOutputStream.newInstance(request, at, 4 + size);
    out.writeFixed32NoTag(Integer.reverseBytes(size)); // the frame's length, big-endian
    out.writeUInt64(FdRequest.REQUEST_ID_FIELD_NUMBER, requestId);
    if (!sessionId.isEmpty()) {
      out.writeString(FdRequest.SESSION_ID_FIELD_NUMBER, sessionId);
    }
    out.writeUInt64(FdRequest.SEGMENT_ID_FIELD_NUMBER, segmentId);
    if (readOnly) {
      out.writeBool(FdRequest.READ_ONLY_FIELD_NUMBER, true);
    }
    if (bind) {
      out.writeBool(FdRequest.BIND_FIELD_NUMBER, true);
    }
    out.checkNoSpaceLeft();
    return at + 4 + size;
  }

  /** One reply read whole: the FdReply, and the descriptor that came after it (-1 for none). */
  record Frame(FdReply reply, int fd) {}

  /**
   * One reply from the connection: its frame (length, then message), then for a grant the byte
   * that carries its descriptor. Bytes are read with as few {@code recvmsg} calls as the kernel
   * allows, each with room for a descriptor, into {@link #received}, where what follows the
   * reply waits for the next read ({@link #buffered()}).
   */
  Frame read(int socket, MessageBuffer buffer) throws IOException {
    fill(socket, buffer, 4);
    int length = ByteBuffer.wrap(received, head, 4).getInt();
    if (length < 0 || length > MAX_REPLY_BYTES) {
      throw new IOException("a reply frame of " + Integer.toUnsignedString(length) + " bytes");
    }
    fill(socket, buffer, 4 + length);
    FdReply reply;
    try {
      reply = FdReply.parseFrom(ByteBuffer.wrap(received, head + 4, length));
    } catch (InvalidProtocolBufferException e) {
      throw new IOException("a reply that is not an FdReply: " + e.getMessage());
    }
    head += 4 + length;
    if (reply.getResultCase() != FdReply.ResultCase.GRANTED) {
      if (fd >= 0 && head >= tail) {
        throw new IOException("a descriptor came where the protocol has none");
      }
      return new Frame(reply, -1);
    }
    fill(socket, buffer, 1);
    if (fd < 0 || head != tail - 1) {
      throw new IOException("the daemon's granted reply came without its descriptor");
    }
    head = 0; // the descriptor's byte was the last one received
    tail = 0;
    int granted = fd;
    fd = -1;
    return new Frame(reply, granted);
  }

  /** Whether bytes of a reply that was not read yet wait here. */
  boolean buffered() {
    return tail > head;
  }

  /** Forgets what waits here (a connection dropped), closing a descriptor that came with it. */
  void reset() {
    Descriptors.closeQuietly(fd);
    fd = -1;
    head = 0;
    tail = 0;
  }

  /**
   * Receives until {@code n} bytes from {@link #head} are here. The kernel ends a receive with
   * the byte that carried descriptors, so a descriptor always came with the last byte received:
   * one that would have to be read past is out of the protocol. Any descriptor beyond the first
   * is closed and fails the read, the daemon being out of step.
   */
  private void fill(int socket, MessageBuffer buffer, int n) throws IOException {
    while (tail - head < n) {
      if (fd >= 0) {
        throw new IOException("a descriptor came where the protocol has none");
      }
      if (received.length - head < n || head == tail) {
        byte[] into = received.length < n ? new byte[Math.max(n, 2 * received.length)] : received;
        System.arraycopy(received, head, into, 0, tail - head);
        received = into;
        tail -= head;
        head = 0;
      }
      int[] extra = {0};
      int got = buffer.receive(socket, received, tail, Math.min(received.length - tail, buffer.capacity()), d -> {
        if (fd < 0) {
          fd = d;
        } else {
          Descriptors.closeQuietly(d);
          extra[0]++;
        }
      });
      if (got == 0) {
        throw new IOException("the daemon closed the fd channel in the middle of a reply");
      }
      tail += got;
      if (extra[0] > 0) {
        throw new IOException("a descriptor came where the protocol has none");
      }
    }
  }
}
