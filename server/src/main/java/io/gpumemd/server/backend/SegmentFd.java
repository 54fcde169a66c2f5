package io.gpumemd.server.backend;

import io.gpumemd.common.unix.Descriptors;
import java.io.Closeable;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * One open file descriptor of a segment, made for one reply of the fd channel: the channel sends
 * its number with {@code SCM_RIGHTS} (the kernel gives the peer a descriptor of its own) and
 * then closes it. It is a descriptor of its own, not the segment's: closing it, or the segment
 * being freed meanwhile, cannot make the number name another file while a send is pending.
 *
 * <p>It owns its number through exactly one closer: the Java file that opened it, or, for a
 * number that a native call returned ({@link #ofNative}: a host segment reopened through {@code
 * /proc/self/fd}, a CUDA VMM export), a {@code close(2)} made once; never through the bare
 * number, so that it is closed exactly once. No transport's type is in it: whoever sends it
 * takes the number. {@link #close} is idempotent and thread-safe.
 */
public final class SegmentFd implements Closeable {
  private final Closeable owner;
  private final int number;
  private final boolean readOnly;

  /**
   * @param file the open file that owns the descriptor
   * @param number its descriptor number in this process
   */
  public SegmentFd(RandomAccessFile file, int number, boolean readOnly) {
    this((Closeable) file, number, readOnly);
  }

  private SegmentFd(Closeable owner, int number, boolean readOnly) {
    this.owner = owner;
    this.number = number;
    this.readOnly = readOnly;
  }

  /**
   * Takes ownership of a descriptor number that native code opened for this process (e.g.
   * {@code open(2)} or {@code cuMemExportToShareableHandle}); closing the result closes it, once.
   *
   * @param readOnly what the grant says; the descriptor itself may carry no such mode (a CUDA
   *     VMM export: the client sets read-only access, see {@code FdGrant.read_only})
   * @throws IOException kept for callers that close the number themselves when owning it fails;
   *     this implementation only refuses a negative number (IllegalArgumentException)
   */
  public static SegmentFd ofNative(int number, boolean readOnly) throws IOException {
    if (number < 0) {
      throw new IllegalArgumentException("descriptor: " + number + " (expected: >= 0)");
    }
    AtomicBoolean open = new AtomicBoolean(true);
    return new SegmentFd(() -> {
      if (open.getAndSet(false)) {
        Descriptors.close(number);
      }
    }, number, readOnly);
  }

  /** The descriptor number in this process, valid until {@link #close}. */
  public int number() {
    return number;
  }

  /** True when it was opened read-only (O_RDONLY), or granted read-only. */
  public boolean readOnly() {
    return readOnly;
  }

  @Override
  public void close() throws IOException {
    owner.close(); // a RandomAccessFile and ofNative's closer both close once
  }

  @Override
  public String toString() {
    return "fd " + number + (readOnly ? " (read-only)" : "");
  }
}
