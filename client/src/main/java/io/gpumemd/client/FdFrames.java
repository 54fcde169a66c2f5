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
 * FdRequest}): request frames encoded into one reused array, reply frames read exactly into
 * another, with the descriptor of a granted reply.
 *
 * <p>Not thread-safe: the {@link FdChannelClient}'s lock guards it.
 */
final class FdFrames {
  /** An FdReply is under 300 bytes; a longer frame is not the daemon. */
  static final int MAX_REPLY_BYTES = 1 << 16;

  private byte[] received = new byte[512];
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
   * One reply from the connection: its frame read exactly (length, then message), then for a
   * grant the byte that carries its descriptor, read with room for it; never a byte past it, so
   * that the next reply's descriptor stays in the socket with its own byte.
   */
  Frame read(int socket, MessageBuffer buffer) throws IOException {
    readExactly(socket, buffer, 4, false);
    int length = ByteBuffer.wrap(received, 0, 4).getInt();
    if (length < 0 || length > MAX_REPLY_BYTES) {
      throw new IOException("a reply frame of " + Integer.toUnsignedString(length) + " bytes");
    }
    if (received.length < length) {
      received = Arrays.copyOf(received, length);
    }
    readExactly(socket, buffer, length, false);
    FdReply reply;
    try {
      reply = FdReply.parseFrom(ByteBuffer.wrap(received, 0, length));
    } catch (InvalidProtocolBufferException e) {
      throw new IOException("a reply that is not an FdReply: " + e.getMessage());
    }
    if (reply.getResultCase() != FdReply.ResultCase.GRANTED) {
      return new Frame(reply, -1);
    }
    int fd = readExactly(socket, buffer, 1, true);
    if (fd < 0) {
      throw new IOException("the daemon's granted reply came without its descriptor");
    }
    return new Frame(reply, fd);
  }

  /**
   * Reads exactly {@code n} bytes into {@link #received}. Returns the
   * descriptor that came with them when {@code descriptor} (-1 for none); any other descriptor is
   * closed and fails the read, the daemon being out of step.
   */
  private int readExactly(int socket, MessageBuffer buffer, int n, boolean descriptor) throws IOException {
    int[] fds = {-1, 0}; // the descriptor, and how many came
    int have = 0;
    try {
      while (have < n) {
        int got = buffer.receive(socket, received, have, n - have, fd -> {
          if (fds[1]++ == 0 && descriptor) {
            fds[0] = fd;
          } else {
            Descriptors.closeQuietly(fd);
          }
        });
        if (got == 0) {
          throw new IOException("the daemon closed the fd channel in the middle of a reply");
        }
        have += got;
      }
      if (fds[1] > (descriptor ? 1 : 0)) {
        throw new IOException("a descriptor came where the protocol has none");
      }
      return fds[0];
    } catch (IOException | RuntimeException e) {
      Descriptors.closeQuietly(fds[0]);
      throw e;
    }
  }
}
