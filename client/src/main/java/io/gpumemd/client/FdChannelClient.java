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
import java.util.HashMap;
import java.util.List;
import java.util.Map;
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
 * <p>Pushed descriptors (see "Pushed descriptors" in {@code gpumemd.proto}): a session's first
 * fetch on a connection binds the session there, in the same send. From then on the daemon
 * pushes each segment new to the session before the Lease reply that names it, so that a fetch
 * first reads what is waiting on the connection, without waiting, and takes the pushed
 * descriptor ({@link PushedDescriptors}) instead of asking. A daemon that refuses the bind (one
 * from before pushes) is asked for every segment, as before. System property {@value
 * #PUSH_PROPERTY}{@code =false} turns binding off.
 *
 * <p>Every wait is bounded by the timeout: connecting, sending, each read of a reply, and the
 * wait for another thread's fetch. Replies are received with {@code recvmsg} and room for a
 * descriptor ({@link FdFrames}, {@link MessageBuffer}): the kernel ends a receive with the byte
 * that carries a grant's descriptor, so most often one call brings a reply, its byte and its
 * descriptor, and what came after a reply waits in {@link FdFrames} for the next read. The
 * connection's native buffer is made when it opens and freed when it closes: a fetch allocates
 * no native memory.
 *
 * <p>Thread-safe: one fetch at a time on the connection ({@code lock}); {@link #close()} from
 * any thread also ends a fetch blocked in a read (shutdown of the socket, under {@code
 * socketLock}, which also guards the socket's number against reuse while it is shut down).
 */
public final class FdChannelClient implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);
  static final long DEFAULT_TIMEOUT_MS = 10_000;
  /** Room for a read of a reply (an FdReply is under 300 bytes) or of the byte carrying its descriptor. */
  private static final int REPLY_BUFFER = 1024;
  /** What {@link #inode} answers for a path where no socket file is. */
  private static final Object NO_FILE = "none";
  /**
   * System property read when a client is built: {@code false} makes it ask for every segment
   * as clients before pushes did, never binding its sessions (to compare both, as {@code
   * FdCostMain} does).
   */
  public static final String PUSH_PROPERTY = "gpumemd.fd.push";

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
  private final FdFrames frames = new FdFrames(); // guarded by lock
  /** Whether this client binds its sessions for pushed descriptors (see {@link #PUSH_PROPERTY}). */
  private final boolean bindSessions;
  /** Descriptors pushed and not taken yet; guarded by lock, kept across connections. */
  private final PushedDescriptors pushed = new PushedDescriptors();
  /** This connection's bound sessions and the request id of each one's bind; guarded by lock. */
  private final Map<String, Long> boundSessions = new HashMap<>();
  /** This connection's daemon refused a bind: it pushes nothing; guarded by lock. */
  private boolean bindRefused;
  private volatile boolean closed;
  private volatile long fetched;
  private volatile long pushedTaken;

  /**
   * @param target the client's gRPC target ({@code unix:///path} or {@code host:port})
   * @param timeoutMillis the bound on each wait
   */
  FdChannelClient(String target, long timeoutMillis) {
    this.ownSocket = target.startsWith("unix://") ? target.substring("unix://".length()) : null;
    this.timeoutMillis = timeoutMillis;
    this.defaultPath = ownSocket != null ? ownSocket + ".fd" : null;
    this.bindSessions = !"false".equalsIgnoreCase(System.getProperty(PUSH_PROPERTY));
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
      if (socket >= 0 && !closed) {
        // A descriptor pushed before the Lease reply is taken before anything else is looked at
        // (the socket file's stat below): it is of the segment and session, whichever socket
        // the handle names. A connection that broke is dropped, and the fetch goes on below.
        try {
          ReceivedDescriptor ready = takePushed(sessionId, segmentId, readOnly);
          if (ready != null) {
            return ready;
          }
        } catch (IOException e) {
          drop();
        }
      }
      Object file = settlePath(fdSocket, segmentId);
      for (int attempt = 1; ; attempt++) {
        if (closed) {
          throw new GpuMemException(Status.Code.CANCELLED, "the client is closed", null);
        }
        try {
          ReceivedDescriptor ready = takePushed(sessionId, segmentId, readOnly);
          if (ready != null) {
            return ready;
          }
          if (socket < 0) {
            connect(file);
            file = null; // looked up before this connection: a second attempt looks again
          }
          // A session's first fetch on a connection binds it first, in the same send: its next
          // new segments come pushed before their Lease replies.
          long bindId = bindSessions && !bindRefused && !boundSessions.containsKey(sessionId) ? nextRequestId++ : 0;
          long requestId = nextRequestId++;
          int length = frames.encode(bindId, requestId, sessionId, segmentId, readOnly);
          if (length <= buffer.capacity()) {
            buffer.sendAll(socket, frames.request(), 0, length, List.of(), null);
          } else {
            // a session id of hundreds of bytes
            UnixSockets.send(socket, Arrays.copyOf(frames.request(), length), List.of());
          }
          if (bindId != 0) {
            receiveBound(bindId, sessionId);
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
        pushed.close();
      }
      lock.unlock();
    }
  }

  /**
   * Settles {@code defaultPath} for a fetch from {@code fdSocket} (null or empty: the one known)
   * and drops a connection to another socket, or to the same path bound anew; answers the socket
   * file there, looked up once for the fetch. Under the fetch lock.
   */
  private Object settlePath(String fdSocket, long segmentId) {
    Object file = null;
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
    return file;
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
   * The reply to {@code requestId}: frames are read one by one, and a pushed one that comes
   * before it is kept ({@link #keepPushed}).
   */
  private ReceivedDescriptor receive(long requestId, long segmentId) throws IOException {
    FdFrames.Frame frame;
    while ((frame = frames.read(socket, buffer)).reply().getPushed()) {
      keepPushed(frame);
    }
    FdReply reply = frame.reply();
    if (reply.getResultCase() != FdReply.ResultCase.GRANTED) {
      check(reply, requestId, segmentId);
      throw new GpuMemException(Status.fromCodeValue(reply.getRefused().getCode()).getCode(),
          reply.getRefused().getMessage(), null);
    }
    try {
      check(reply, requestId, segmentId);
    } catch (RuntimeException e) {
      Descriptors.closeQuietly(frame.fd());
      throw e;
    }
    FdGrant grant = reply.getGranted();
    fetched++;
    return new ReceivedDescriptor(frame.fd(), segmentId, grant.getSegmentBytes(), grant.getReadOnly());
  }

  /**
   * The answer to the bind {@code bindId} of {@code sessionId}, read after the bind and before
   * the request sent with it: bound, or refused by a daemon that pushes nothing (one from before
   * pushes reads a bind as a request for segment 0), which this connection then asks no more.
   */
  private void receiveBound(long bindId, String sessionId) throws IOException {
    FdFrames.Frame frame;
    while ((frame = frames.read(socket, buffer)).reply().getPushed()) {
      keepPushed(frame);
    }
    Descriptors.closeQuietly(frame.fd()); // an answer of a daemon that does not know binds
    if (frame.reply().getRequestId() != bindId) {
      throw new IOException("the answer to bind request " + bindId + " came for request "
          + frame.reply().getRequestId());
    }
    if (frame.reply().getResultCase() == FdReply.ResultCase.BOUND) {
      boundSessions.put(sessionId, bindId);
    } else {
      // Whatever else it answered (a refusal of segment 0, most often), it pushes nothing.
      bindRefused = true;
      log.debug("fd channel {}: no pushed descriptors ({})", path, frame.reply().getResultCase());
    }
  }

  /**
   * The descriptor pushed for the segment and session, if any (else null): one kept already, or
   * one among the pushed replies waiting on the connection, read up to it without waiting for
   * more (those after it stay for the next fetch).
   */
  private ReceivedDescriptor takePushed(String sessionId, long segmentId, boolean readOnly) throws IOException {
    ReceivedDescriptor descriptor = pushed.take(sessionId, segmentId, readOnly);
    while (descriptor == null && socket >= 0 && !boundSessions.isEmpty()
        && (frames.buffered() || UnixSockets.readable(socket) > 0)) {
      FdFrames.Frame frame = frames.read(socket, buffer);
      if (!frame.reply().getPushed()) {
        Descriptors.closeQuietly(frame.fd());
        throw new IOException("a reply to request " + frame.reply().getRequestId() + ", which was not asked");
      }
      // Pushes read up to the one for this segment: the rest wait in the socket for the next fetch.
      if (keepPushed(frame) && frame.reply().getGranted().getSegmentId() == segmentId) {
        descriptor = pushed.take(sessionId, segmentId, readOnly);
      }
    }
    if (descriptor != null) {
      fetched++;
      pushedTaken++;
    }
    return descriptor;
  }

  /**
   * Keeps a pushed descriptor under the session whose bind its reply names, and returns true;
   * closes any other.
   */
  private boolean keepPushed(FdFrames.Frame frame) {
    FdReply reply = frame.reply();
    String session = null;
    for (Map.Entry<String, Long> bound : boundSessions.entrySet()) {
      if (bound.getValue() == reply.getRequestId()) {
        session = bound.getKey();
      }
    }
    if (session == null || frame.fd() < 0 || reply.getResultCase() != FdReply.ResultCase.GRANTED) {
      Descriptors.closeQuietly(frame.fd()); // a session bound on a connection since dropped
      return false;
    }
    FdGrant grant = reply.getGranted();
    pushed.keep(session, new ReceivedDescriptor(frame.fd(), grant.getSegmentId(), grant.getSegmentBytes(),
        grant.getReadOnly()));
    return true;
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

  /** Of {@link #fetched}, those the daemon pushed before the Lease reply (no request sent). */
  public long pushed() {
    return pushedTaken;
  }

  /** Pushed descriptors kept and not taken (for tests). */
  int pushedKept() {
    lock.lock();
    try {
      return pushed.size();
    } finally {
      lock.unlock();
    }
  }

  /** Descriptors handed out since the client started (fetched or pushed), over every connection. */
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
    frames.reset(); // what was received of this connection and not read
    boundSessions.clear(); // a new connection binds again, and asks its daemon again
    bindRefused = false;
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
        pushed.close();
      } finally {
        lock.unlock();
      }
    }
  }
}
