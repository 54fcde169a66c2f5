package io.gpumemd.server.backend.host;

import io.gpumemd.common.unix.ErrnoCalls.ErrnoException;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentFd;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The host backend's segments in descriptor mode ({@code --host-segments fd}): sealed memfds,
 * which have no path at all, held open by the daemon and handed to clients by the fd channel.
 * Each is sized, backed and sealed against growing and shrinking ({@link Memfds}) before any
 * descriptor of it leaves the daemon, so no client can resize it; and a descriptor received from
 * a predecessor is adopted only when it is such a segment. Owns the descriptors until each
 * segment is freed or the backend closes.
 *
 * <p>Thread-safe: the open segments are a concurrent set; each segment closes once.
 */
final class SealedSegments {
  private static final Logger log = LoggerFactory.getLogger(HostShmBackend.class);
  /** What {@code /proc/self/fd} shows for a segment: {@code /memfd:gpumemd-seg-D-N (deleted)}. */
  private static final String LINK_PREFIX = "/memfd:" + Memfds.NAME_PREFIX;
  private static final int RESIZE_SEALS = Memfds.F_SEAL_GROW | Memfds.F_SEAL_SHRINK;

  /** The fd channel's socket, named in each segment's handle. */
  private final String fdSocket;
  /** Segments not yet freed, closed at the backend's close. */
  private final Set<HostFdSegment> openSegments = ConcurrentHashMap.newKeySet();

  SealedSegments(String fdSocket) {
    this.fdSocket = fdSocket;
  }

  /**
   * A new segment: a memfd named {@code name} (mode 0600, see {@link Memfds#create}), owned from
   * the start by a Java file opened through {@code /proc/self/fd} (so that exactly one closer owns
   * the daemon's descriptor, as for every other file), then backed with zeros and sealed. The raw
   * number memfd_create returned is closed, success or not. The number read from the JVM is
   * checked to be the memfd's (same inode): a wrong one would hand clients some other file.
   *
   * @throws IOException ENOMEM or ENOSPC while backing, when the memory for it is not there
   */
  HostFdSegment allocate(int device, long bytes, String name) throws IOException {
    int raw = Memfds.create(name);
    try {
      // Backed before it is sealed (a sealed memfd could not grow to its size), and sealed before
      // the segment exists for anyone to open a descriptor of.
      return keep(device, bytes, Path.of("/proc/self/fd/" + raw), "the new segment's memfd " + name, (file, number) -> {
        back(file, number, bytes);
        Memfds.seal(number);
      });
    } finally {
      Memfds.closeQuietly(raw);
    }
  }

  /** What is done to a segment's file between its opening and its segment's making. */
  @FunctionalInterface
  private interface Preparation {
    void prepare(RandomAccessFile file, int number) throws IOException;
  }

  /**
   * The segment of the memfd at {@code path}, opened read-write as a Java file that owns the
   * daemon's descriptor from then on, and kept until it is freed. The number read from the JVM is
   * checked to be the memfd's (same inode), since a wrong one would hand clients some other file
   * ({@code what} names the memfd in that error); then {@code preparation} runs. On any failure
   * the file is closed and no segment made.
   */
  private HostFdSegment keep(int device, long bytes, Path path, String what, Preparation preparation)
      throws IOException {
    RandomAccessFile file = new RandomAccessFile(path.toFile(), "rw");
    try {
      int number = JdkFdNumbers.of(file.getFD());
      Path numbered = Path.of("/proc/self/fd/" + number);
      if (!Files.isSameFile(numbered, path)) {
        throw new BackendException("descriptor number " + number + " read from the JVM names "
            + Files.readSymbolicLink(numbered) + ", not " + what);
      }
      preparation.prepare(file, number);
      HostFdSegment segment = new HostFdSegment(device, bytes, file, number, new IpcHandle.HostFd(fdSocket));
      openSegments.add(segment);
      return segment;
    } catch (IOException | RuntimeException | Error e) {
      file.close();
      throw e;
    }
  }

  /**
   * Backs a new segment's memfd: {@link Memfds#allocate} (no 2 MiB of zeros copied per segment,
   * the larger part of a miss's cost), or zeros written where the kernel cannot allocate it so.
   */
  private static void back(RandomAccessFile file, int number, long bytes) throws IOException {
    try {
      Memfds.allocate(number, bytes);
    } catch (ErrnoException e) {
      if (e.errno() != Memfds.EOPNOTSUPP) {
        throw e; // ENOSPC, ENOMEM: the caller's out-of-memory, by the message
      }
      SegmentFiles.writeZeros(file.getChannel(), 0, bytes);
    }
  }

  /**
   * A segment from a descriptor a predecessor daemon sent ({@code --take-over}): it must be a
   * segment as {@link #allocate} makes them, a memfd named {@code gpumemd-seg-...}, sealed against
   * growing and shrinking, of exactly {@code bytes}; anything else is refused. Without the seals
   * whoever held a writable descriptor of it could have resized it, and still could. The file is
   * reopened read-write through {@code /proc/self/fd} (a descriptor of this backend's own, owned by
   * a Java file like a new segment's) and the received number is closed, success or not.
   */
  HostFdSegment adopt(int device, int fd, long bytes) throws IOException {
    try {
      Path received = Path.of("/proc/self/fd/" + fd);
      String target = Files.readSymbolicLink(received).toString();
      if (!target.startsWith(LINK_PREFIX)) {
        throw new BackendException("descriptor " + fd + " names " + target + " (expected: a memfd named "
            + Memfds.NAME_PREFIX + "..., a segment of a host backend with --host-segments fd)");
      }
      int seals;
      try {
        seals = Memfds.seals(fd);
      } catch (ErrnoException e) {
        throw new BackendException("descriptor " + fd + " (" + target + ") takes no seals (F_GET_SEALS: "
            + e.getMessage() + "; expected: a sealed memfd, a segment of a host backend with --host-segments fd)", e);
      }
      if ((seals & RESIZE_SEALS) != RESIZE_SEALS) {
        throw new BackendException("descriptor " + fd + " (" + target + ") has seals " + Memfds.describe(seals)
            + " (expected: F_SEAL_GROW and F_SEAL_SHRINK: an unsealed segment could have been resized by any "
            + "holder of a writable descriptor)");
      }
      return keep(device, bytes, received, "the reopened segment " + target, (file, number) -> {
        if (file.length() != bytes) {
          throw new BackendException("descriptor " + fd + ": " + file.length() + " bytes (expected: " + bytes
              + ", as the state says)");
        }
      });
    } finally {
      closeReceived(fd);
    }
  }

  /** Closes a descriptor number received from another process, which no Java object owns. */
  static void closeReceived(int fd) {
    try {
      SegmentFd.ofNative(fd, false).close();
    } catch (IOException | RuntimeException e) {
      log.error("Cannot close received descriptor {}: {}", fd, e.toString());
    }
  }

  /**
   * Closes the daemon's descriptor: the memory goes once no client maps it any more.
   *
   * @return true when the segment's bytes are free on the device now
   */
  boolean free(HostFdSegment segment) {
    openSegments.remove(segment);
    try {
      return segment.close();
    } catch (IOException e) {
      // close(2) releases the descriptor even when it reports an error: the bytes are free.
      log.error("Closing {} reported: {}", segment, e.toString());
      return true;
    }
  }

  /** The segments not yet freed, a copy. */
  List<HostFdSegment> open() {
    return List.copyOf(openSegments);
  }
}
