package io.gpumemd.server.backend.host;

import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.server.backend.AbstractFdPassedSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentFd;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.channels.FileChannel;

/**
 * A host segment held only as an open memfd, sealed against growing and shrinking ({@code
 * --host-segments fd}, {@link SealedSegments}): the daemon writes it through {@link #channel}, and
 * clients get descriptors of it ({@link #open}) over the fd channel. Its memory lives as long as
 * the daemon's descriptor or any client's mapping, so nothing of it is on a path, and a client
 * keeps what it mapped when the daemon dies. Its size is fixed: the seals bind every descriptor
 * of it, the clients' too.
 *
 * <p>Thread-safety: {@link #open} and {@link #close} are ordered by this object's monitor
 * ({@link AbstractFdPassedSegment}), so a descriptor is opened only through the segment's own
 * number while that number is still the segment's.
 */
final class HostFdSegment extends AbstractFdPassedSegment {
  private final RandomAccessFile file;
  /** The number of {@link #file}'s descriptor; descriptors for clients are opened through it. */
  private final int number;

  HostFdSegment(int device, long bytes, RandomAccessFile file, int number, IpcHandle.HostFd handle) {
    super(device, bytes, handle);
    this.file = file;
    this.number = number;
  }

  /** The number of the daemon's own descriptor (for tests: it is closed on free). */
  int number() {
    return number;
  }

  /** The segment's file, for the backend's writes (backing, zeroing). */
  FileChannel channel() {
    return file.getChannel();
  }

  /**
   * A new open file description of the segment, through {@code /proc/self/fd}: unlike a {@code
   * dup}, it has an access mode of its own, so a read-only one cannot be mapped writable. The
   * memfd is the daemon's, mode 0600 ({@link Memfds#create}), so a client of another user cannot
   * reopen its read-only descriptor read-write through its own {@code /proc/self/fd} either. The
   * seals are the inode's, so a reopened descriptor carries them.
   */
  @Override
  protected SegmentFd openLive(boolean readOnly) throws IOException {
    // openat(2) itself, not a Java file: no JVM object, no reflection to read the number back
    return own(Descriptors.reopen(number, readOnly), readOnly, SegmentFd::ofNative);
  }

  /**
   * Closes the daemon's descriptor; the memory goes once no client maps it. Descriptors handed
   * out by {@link #open} are their holders' to close.
   *
   * @return false when it was already closed
   */
  synchronized boolean close() throws IOException {
    if (!markGone()) {
      return false;
    }
    file.close(); // under the monitor: no openLive reads the number while it is let go of
    return true;
  }

  @Override
  public String toString() {
    return "host segment of " + bytes() + " bytes on device " + device() + " (fd " + number + ", a sealed memfd)";
  }
}
