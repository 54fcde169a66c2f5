package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentDescriptor;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The host backend's segments in descriptor mode ({@code --host-segments fd}): files removed
 * as soon as they are opened, so that nothing of a live segment is on a path, held open by the
 * daemon and handed to clients by the fd channel. Owns the descriptors until each segment is
 * freed or the backend closes.
 *
 * <p>Thread-safe: the open segments are a concurrent set; each segment closes once.
 */
final class UnlinkedSegments {
  private static final Logger log = LoggerFactory.getLogger(HostShmBackend.class);

  /** The fd channel's socket, named in each segment's handle. */
  private final String fdSocket;
  /** Segments not yet freed, closed at the backend's close. */
  private final Set<HostFdSegment> openSegments = ConcurrentHashMap.newKeySet();

  UnlinkedSegments(String fdSocket) {
    this.fdSocket = fdSocket;
  }

  /**
   * A segment with no path (descriptor mode): its file is created, opened and removed before
   * it is backed, so that a daemon killed while backing a large segment leaves nothing behind.
   * The descriptor number read from the JVM is checked against {@code /proc/self/fd} while the
   * file still has its path: a wrong number would hand clients some other file.
   */
  HostFdSegment allocate(int device, long bytes, Path path) throws IOException {
    Files.createFile(path, PosixFilePermissions.asFileAttribute(HostShmBackend.OWNED_FILE_MODE));
    RandomAccessFile file = null;
    try {
      file = new RandomAccessFile(path.toFile(), "rw");
      int number = DescriptorNumbers.of(file.getFD());
      Path named = Files.readSymbolicLink(Path.of("/proc/self/fd/" + number));
      if (!named.equals(path)) {
        throw new BackendException("descriptor number " + number + " read from the JVM names " + named
            + ", not the new segment file " + path);
      }
      Files.delete(path);
      HostShmBackend.writeZeros(file.getChannel(), 0, bytes);
      HostFdSegment segment = new HostFdSegment(device, bytes, file, number, new IpcHandle.HostFd(fdSocket));
      openSegments.add(segment);
      return segment;
    } catch (IOException | RuntimeException e) {
      if (file != null) {
        file.close();
      }
      throw e;
    } finally {
      Files.deleteIfExists(path); // gone already, unless something failed before its removal
    }
  }

  /**
   * A segment from a descriptor a predecessor daemon sent ({@code --take-over}): the file is
   * reopened read-write through {@code /proc/self/fd} (a descriptor of this backend's own, owned
   * by a Java file like a new segment's) and the received number is closed, success or not. It
   * must be an unlinked regular file of exactly {@code bytes}: anything else is not a segment of
   * a host backend in descriptor mode.
   */
  HostFdSegment adopt(int device, int fd, long bytes) throws IOException {
    RandomAccessFile file = null;
    try {
      Path received = Path.of("/proc/self/fd/" + fd);
      String target = Files.readSymbolicLink(received).toString();
      if (!target.endsWith(" (deleted)") || !Files.isRegularFile(received)) {
        throw new BackendException("descriptor " + fd + " names " + target
            + " (expected: an unlinked segment file of a host backend with --host-segments fd)");
      }
      file = new RandomAccessFile(received.toFile(), "rw");
      if (file.length() != bytes) {
        throw new BackendException("descriptor " + fd + ": " + file.length() + " bytes (expected: " + bytes
            + ", as the state says)");
      }
      int number = DescriptorNumbers.of(file.getFD());
      Object ino = Files.getAttribute(Path.of("/proc/self/fd/" + number), "unix:ino");
      if (!ino.equals(Files.getAttribute(received, "unix:ino"))) {
        throw new BackendException("descriptor number " + number + " read from the JVM is not the reopened "
            + "segment file");
      }
      HostFdSegment segment = new HostFdSegment(device, bytes, file, number, new IpcHandle.HostFd(fdSocket));
      openSegments.add(segment);
      file = null;
      return segment;
    } finally {
      if (file != null) {
        file.close();
      }
      closeReceived(fd);
    }
  }

  /** Closes a descriptor number received from another process, which no Java object owns. */
  static void closeReceived(int fd) {
    try {
      SegmentDescriptor.ofNative(fd, false).close();
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
