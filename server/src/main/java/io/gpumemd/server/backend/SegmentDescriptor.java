package io.gpumemd.server.backend;

import java.io.Closeable;
import java.io.IOException;
import java.io.RandomAccessFile;

/**
 * One open file descriptor of a segment, made for one reply of the fd channel: the channel sends
 * its number with {@code SCM_RIGHTS} (the kernel gives the peer a descriptor of its own) and
 * then closes it. It is a descriptor of its own, not the segment's: closing it, or the segment
 * being freed meanwhile, cannot make the number name another file while a send is pending.
 *
 * <p>Closed through the Java file that owns the number, never through the number itself, so
 * that it is closed exactly once. {@link #close} is idempotent and thread-safe.
 */
public final class SegmentDescriptor implements Closeable {
  private final RandomAccessFile file;
  private final int number;
  private final boolean readOnly;

  /**
   * @param file the open file that owns the descriptor
   * @param number its descriptor number in this process
   */
  public SegmentDescriptor(RandomAccessFile file, int number, boolean readOnly) {
    this.file = file;
    this.number = number;
    this.readOnly = readOnly;
  }

  /** The descriptor number in this process, valid until {@link #close}. */
  public int number() {
    return number;
  }

  /** True when it was opened read-only (O_RDONLY). */
  public boolean readOnly() {
    return readOnly;
  }

  @Override
  public void close() throws IOException {
    file.close();
  }

  @Override
  public String toString() {
    return "fd " + number + (readOnly ? " (read-only)" : "");
  }
}
