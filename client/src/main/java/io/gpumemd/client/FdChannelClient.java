package io.gpumemd.client;

import com.google.protobuf.CodedOutputStream;
import com.google.protobuf.InvalidProtocolBufferException;
import io.gpumemd.proto.v1.FdGrant;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.grpc.Status;
import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.ErrnoCalls;
import io.gpumemd.common.unix.MessageBuffer;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.common.unix.UnsupportedPlatformException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A client's connection to the daemon's fd channel, where it fetches the descriptor of a segment
 * passed by descriptor ({@code MemoryHandle.fd_segment}, {@code cuda_vmm}); the protocol is
 * documented in {@code gpumemd.proto} above {@code FdRequest}. One per {@link GpuMemClient}:
 * opened on the first fetch, opened again after a failure (a daemon restart, a connection the
 * daemon closed), replaced when a handle names another socket, closed with the client.
 *
 * <p>Where the channel is: the handle's {@code FdSegment.fd_socket} where that path exists;
 * else, for a {@code unix://} target (a container that mounts the daemon's socket directory
 * elsewhere), that file name in the directory of the client's own gRPC socket. Without a
 * handle ({@link #fetch(String, long, boolean)}) the socket last used, or the daemon's default,
 * the gRPC socket's path with {@code ".fd"} appended.
 *
 * <p>Every wait is bounded by the timeout: connecting, sending, each read of a reply, and the
 * wait for another thread's fetch. A reply is read with {@code recvmsg} that always has room for
 * a descriptor ({@link MessageBuffer}), so the byte after a granted reply may come in the same
 * read as its frame (a plain read of that byte would make the kernel close the descriptor it
 * carries): the daemon sends nothing but the reply to the one request outstanding, so a
 * round trip is one send and, most often, one receive. The connection's native buffer is made
 * when it opens and freed when it closes: a fetch allocates no native memory.
 *
 * <p>Thread-safe: one fetch at a time on the connection ({@code lock}); {@link #close()} from
 * any thread also ends a fetch blocked in a read (shutdown of the socket, under {@code
 * socketLock}, which also guards the socket's number against reuse while it is shut down).
 */
public final class FdChannelClient implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);
  /** An FdReply is under 300 bytes; a longer frame is not the daemon. */
  static final int MAX_REPLY_BYTES = 1 << 16;
  static final long DEFAULT_TIMEOUT_MS = 10_000;
  /** Room for a reply (an FdReply is under 300 bytes) and the byte carrying its descriptor, in one read. */
  private static final int REPLY_BUFFER = 1024;
  /** What {@link #inode} answers for a path where no socket file is. */
  private static final Object NO_FILE = "none";

  private final String ownSocket;
  private final long timeoutMillis;
  private final ReentrantLock lock = new ReentrantLock();
  private final Object socketLock = new Object();
  private long nextRequestId = 1; // guarded by lock
  private String defaultPath; // guarded by lock
  private String path; // the connected socket's path; guarded by lock
  private Object socketFile; // the inode of the socket file when connected; guarded by lock
  private int socket = -1; // guarded by lock for use, by socketLock for close and shutdown
  private MessageBuffer buffer; // the connection's; guarded by lock
  private byte[] received = new byte[REPLY_BUFFER]; // guarded by lock
  private byte[] request = new byte[128]; // the frame being sent; guarded by lock
  private volatile boolean closed;
  private volatile long fetched;

  /**
   * @param target the client's gRPC target ({@code unix:///path} or {@code host:port})
   * @param timeoutMillis the bound on each wait
   */
  FdChannelClient(String target, long timeoutMillis) {
    this.ownSocket = target.startsWith("unix://") ? target.substring("unix://".length()) : null;
    this.timeoutMillis = timeoutMillis;
    this.defaultPath = ownSocket != null ? ownSocket + ".fd" : null;
  }

  /**
   * The path to connect to for a handle's {@code fd_socket}: that path where it exists, else its
   * file name next to the client's own gRPC socket.
   */
  static String socketPath(String ownSocket, String fdSocket) {
    if (ownSocket == null || Files.exists(Path.of(fdSocket))) {
      return fdSocket;
    }
    Path dir = Path.of(ownSocket).getParent();
    Path name = Path.of(fdSocket).getFileName();
    return dir == null || name == null ? fdSocket : dir.resolve(name).toString();
  }

  /**
   * The descriptor of {@code segmentId} for {@code sessionId}, from the socket last used (or
   * the daemon's default next to the gRPC socket). The caller closes it.
   *
   * @throws GpuMemException the daemon's refusal (its status code and message), or UNAVAILABLE
   *     when the channel cannot be reached or does not answer in time
   */
  public ReceivedDescriptor fetch(String sessionId, long segmentId, boolean readOnly) {
    return fetchAt(null, sessionId, segmentId, readOnly);
  }

  /**
   * As {@link #fetch(String, long, boolean)}, from the fd channel a handle names ({@code
   * FdSegment.fd_socket}).
   */
  public ReceivedDescriptor fetch(String fdSocket, String sessionId, long segmentId, boolean readOnly) {
    return fetchAt(fdSocket, sessionId, segmentId, readOnly);
  }

  private ReceivedDescriptor fetchAt(String fdSocket, String sessionId, long segmentId, boolean readOnly) {
    acquireLock(segmentId);
    try {
      Object file = null; // the socket file at defaultPath, once looked up (one stat a fetch)
      if (fdSocket != null && !fdSocket.isEmpty()) {
        Object named = inode(fdSocket);
        if (ownSocket == null || named != NO_FILE) { // socketPath's rule, with the stat done once
          defaultPath = fdSocket;
          file = named;
        } else {
          defaultPath = socketPath(ownSocket, fdSocket);
        }
      }
      if (defaultPath == null) {
        throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "segment " + segmentId + " is passed by "
            + "descriptor, and this client (a TCP target) knows no fd channel to fetch it from", null);
      }
      if (file == null) {
        file = inode(defaultPath);
      }
      if (!defaultPath.equals(path) || (socket >= 0 && !socketFile.equals(file))) {
        // another socket, or the same path bound anew (a restarted daemon): the old connection
        // may linger half-open (a daemon that stopped without closing it), never answering
        drop();
      }
      for (int attempt = 1; ; attempt++) {
        if (closed) {
          throw new GpuMemException(Status.Code.CANCELLED, "the client is closed", null);
        }
        long requestId = nextRequestId++;
        try {
          if (socket < 0) {
            connect(file);
            file = null; // looked up before this connection: a second attempt looks again
          }
          int length = frame(requestId, sessionId, segmentId, readOnly);
          if (length <= buffer.capacity()) {
            buffer.sendAll(socket, request, 0, length, List.of(), null);
          } else {
            // a session id of hundreds of bytes
            UnixSockets.send(socket, Arrays.copyOf(request, length), List.of());
          }
          return receive(requestId, segmentId);
        } catch (IOException e) {
          drop();
          // A connection the daemon closed (restart, idle) is tried once more on a new one; a
          // timeout is not: the daemon is there and did not answer.
          if (attempt == 2 || e instanceof ErrnoCalls.ErrnoException errno && errno.timedOut() || closed) {
            throw new GpuMemException(Status.Code.UNAVAILABLE, "cannot fetch segment " + segmentId
                + " from the fd channel " + defaultPath + ": " + e.getMessage(), e);
          }
          log.debug("fd channel {}: {}; connecting again", defaultPath, e.getMessage());
        }
      }
    } finally {
      if (closed) {
        drop(); // a connection opened while close() ran
      }
      lock.unlock();
    }
  }

  /** Opens the connection to {@code defaultPath}, whose socket file was {@code file} (null: look it up). */
  private void connect(Object file) throws IOException {
    if (file == null) {
      file = inode(defaultPath);
    }
    int fd;
    try {
      fd = UnixSockets.connect(defaultPath, timeoutMillis);
    } catch (UnsupportedPlatformException e) {
      throw new GpuMemException(Status.Code.UNIMPLEMENTED, "segments passed as file descriptors "
          + "(--host-segments fd) are mapped on 64-bit Linux only; this is " + System.getProperty("os.name")
          + " " + System.getProperty("os.arch") + " (ask the operator for --host-segments path)", null);
    }
    try {
      buffer = new MessageBuffer(REPLY_BUFFER, 1);
    } catch (IOException | RuntimeException e) {
      Descriptors.closeQuietly(fd);
      throw e;
    }
    socketFile = file;
    synchronized (socketLock) {
      socket = fd;
      path = defaultPath;
    }
  }

  /**
   * The identity of the socket file at {@code path} (its device and inode, the attributes' file
   * key), or {@link #NO_FILE} when there is none. Read through the basic attributes, the JDK's
   * shortest way to one {@code stat}: no attribute name to parse, no map to fill.
   */
  private static Object inode(String path) {
    try {
      Object key = Files.readAttributes(Path.of(path), BasicFileAttributes.class).fileKey();
      return key != null ? key : NO_FILE;
    } catch (IOException | UnsupportedOperationException | IllegalArgumentException e) {
      return NO_FILE; // the connect that follows says why
    }
  }

  private void acquireLock(long segmentId) {
    try {
      // the holder's own waits are bounded by the timeout: reading a reply, maybe once more
      if (!lock.tryLock(3 * timeoutMillis, TimeUnit.MILLISECONDS)) {
        throw new GpuMemException(Status.Code.UNAVAILABLE, "segment " + segmentId
            + ": another fetch from the fd channel did not finish in time", null);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new GpuMemException(Status.Code.CANCELLED, "interrupted while waiting for the fd channel", e);
    }
  }

  /**
   * Writes the request's frame (length, then the FdRequest) into {@link #request}, grown as
   * needed, and returns its length. Encoded field by field, as the generated code would, without
   * a builder and a message per fetch.
   */
  private int frame(long requestId, String sessionId, long segmentId, boolean readOnly) throws IOException {
    int size = CodedOutputStream.computeUInt64Size(FdRequest.REQUEST_ID_FIELD_NUMBER, requestId)
        + (sessionId.isEmpty() ? 0 : CodedOutputStream.computeStringSize(FdRequest.SESSION_ID_FIELD_NUMBER, sessionId))
        + CodedOutputStream.computeUInt64Size(FdRequest.SEGMENT_ID_FIELD_NUMBER, segmentId)
        + (readOnly ? CodedOutputStream.computeBoolSize(FdRequest.READ_ONLY_FIELD_NUMBER, true) : 0);
    if (request.length < 4 + size) {
      request = new byte[4 + size];
    }
    CodedOutputStream out = CodedOutputStream.newInstance(request, 0, 4 + size);
    out.writeFixed32NoTag(Integer.reverseBytes(size)); // the frame's length, big-endian
    out.writeUInt64(FdRequest.REQUEST_ID_FIELD_NUMBER, requestId);
    if (!sessionId.isEmpty()) {
      out.writeString(FdRequest.SESSION_ID_FIELD_NUMBER, sessionId);
    }
    out.writeUInt64(FdRequest.SEGMENT_ID_FIELD_NUMBER, segmentId);
    if (readOnly) {
      out.writeBool(FdRequest.READ_ONLY_FIELD_NUMBER, true);
    }
    out.checkNoSpaceLeft();
    return 4 + size;
  }

  /**
   * One reply: its frame, then for a grant the byte carrying the descriptor, read as they come
   * (one {@code recvmsg} when both are there), never past the reply.
   */
  private ReceivedDescriptor receive(long requestId, long segmentId) throws IOException {
    int[] fds = {-1, -1}; // the descriptor, and whether more came (a daemon out of step)
    int have = 0;
    int frameEnd = -1; // after the frame: where the descriptor's byte is
    FdReply reply = null;
    try {
      while (true) {
        if (frameEnd < 0 && have >= 4) {
          int length = ByteBuffer.wrap(received, 0, 4).getInt();
          if (length < 0 || length > MAX_REPLY_BYTES) {
            throw new IOException("a reply frame of " + Integer.toUnsignedString(length) + " bytes");
          }
          frameEnd = 4 + length;
          if (received.length < frameEnd + 1) {
            received = Arrays.copyOf(received, frameEnd + 1);
          }
        }
        if (reply == null && frameEnd >= 0 && have >= frameEnd) {
          try {
            reply = FdReply.parseFrom(ByteBuffer.wrap(received, 4, frameEnd - 4));
          } catch (InvalidProtocolBufferException e) {
            throw new IOException("a reply that is not an FdReply: " + e.getMessage());
          }
          if (reply.getResultCase() != FdReply.ResultCase.GRANTED) {
            if (have > frameEnd || fds[0] >= 0) {
              drop(); // bytes or a descriptor after a refusal: out of step with the daemon
            }
            check(reply, requestId, segmentId);
            throw new GpuMemException(Status.fromCodeValue(reply.getRefused().getCode()).getCode(),
                reply.getRefused().getMessage(), null);
          }
        }
        if (reply != null && have > frameEnd) {
          break; // the byte after a granted reply's frame: the one that carries its descriptor
        }
        int want = (frameEnd < 0 ? Math.min(received.length, 4 + MAX_REPLY_BYTES) : frameEnd + 1) - have;
        int got = buffer.receive(socket, received, have, want, n -> {
          if (fds[0] < 0) {
            fds[0] = n;
          } else {
            fds[1] = 0;
            Descriptors.closeQuietly(n);
          }
        });
        if (got == 0) {
          throw new IOException(reply == null ? "the daemon closed the fd channel in the middle of a reply"
              : "the daemon closed the fd channel before the descriptor of a granted reply");
        }
        have += got;
      }
      if (fds[0] < 0 || fds[1] >= 0 || have != frameEnd + 1) {
        throw new IOException("the daemon's granted reply came without its descriptor");
      }
      check(reply, requestId, segmentId);
    } catch (IOException | RuntimeException e) {
      Descriptors.closeQuietly(fds[0]);
      throw e;
    }
    int fd = fds[0];
    FdGrant grant = reply.getGranted();
    fetched++;
    return new ReceivedDescriptor(fd, segmentId, grant.getSegmentBytes(), grant.getReadOnly());
  }

  private void check(FdReply reply, long requestId, long segmentId) {
    if (reply.getRequestId() != requestId) {
      drop(); // out of step with the daemon: a new connection for the next fetch
      throw new GpuMemException(Status.Code.INTERNAL, "fd channel: the reply to request " + reply.getRequestId()
          + " came for request " + requestId, null);
    }
    if (reply.getResultCase() == FdReply.ResultCase.GRANTED && reply.getGranted().getSegmentId() != segmentId) {
      throw new GpuMemException(Status.Code.INTERNAL, "fd channel: asked for segment " + segmentId
          + ", granted segment " + reply.getGranted().getSegmentId(), null);
    }
    if (reply.getResultCase() == FdReply.ResultCase.RESULT_NOT_SET) {
      throw new GpuMemException(Status.Code.INTERNAL, "fd channel: a reply for segment " + segmentId
          + " that neither grants nor refuses", null);
    }
  }

  /** Descriptors received since the client started, over every connection. */
  public long fetched() {
    return fetched;
  }

  /** True while a connection is open (for tests). */
  boolean connected() {
    synchronized (socketLock) {
      return socket >= 0;
    }
  }

  /** Shuts the connection down under the client, as a daemon closing it would (for tests). */
  void breakForTest() {
    synchronized (socketLock) {
      if (socket >= 0) {
        UnixSockets.shutdownQuietly(socket);
      }
    }
  }

  private void drop() {
    synchronized (socketLock) {
      if (socket >= 0) {
        Descriptors.closeQuietly(socket);
        socket = -1;
        path = null;
      }
    }
    if (buffer != null) {
      buffer.close();
      buffer = null;
    }
  }

  /** Closes the connection; a fetch blocked in a read ends at once (UNAVAILABLE). Idempotent. */
  @Override
  public void close() {
    closed = true;
    synchronized (socketLock) {
      if (socket >= 0) {
        UnixSockets.shutdownQuietly(socket); // the fetching thread, if any, closes it
      }
    }
    if (lock.tryLock()) {
      try {
        drop();
      } finally {
        lock.unlock();
      }
    }
  }
}
