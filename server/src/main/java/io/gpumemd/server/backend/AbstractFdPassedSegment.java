package io.gpumemd.server.backend;

import io.gpumemd.common.unix.Descriptors;
import java.io.IOException;

/**
 * What every {@link FdPassedSegment} shares, whatever its memory: its device, size and handle,
 * and the one rule that orders exporting against freeing: once the backend has let go of the
 * segment ({@link #markGone}), {@link #open} answers null instead of a descriptor, so nothing is
 * opened through a number or handle the daemon no longer owns. A subclass says how a descriptor
 * of its memory is made ({@link #openLive}) and what the daemon holds ({@code VmmSegment}: a CUDA
 * VMM allocation; {@code HostFdSegment}: a sealed memfd).
 *
 * <p>Thread-safety: {@link #open} and {@link #markGone} are ordered by this object's monitor;
 * {@link #openLive} runs under it. The rest is immutable.
 */
public abstract class AbstractFdPassedSegment implements FdPassedSegment {
  private final int device;
  private final long bytes;
  private final IpcHandle handle;
  private boolean gone; // guarded by this

  protected AbstractFdPassedSegment(int device, long bytes, IpcHandle handle) {
    this.device = device;
    this.bytes = bytes;
    this.handle = handle;
  }

  @Override
  public final int device() {
    return device;
  }

  @Override
  public final long bytes() {
    return bytes;
  }

  @Override
  public final IpcHandle handle() {
    return handle;
  }

  @Override
  public final synchronized SegmentFd open(boolean readOnly) throws IOException {
    if (gone) {
      return null;
    }
    return openLive(readOnly);
  }

  /**
   * A new descriptor of the segment's memory, which the daemon still holds: called under this
   * object's monitor, so {@link #markGone} waits for it.
   */
  protected abstract SegmentFd openLive(boolean readOnly) throws IOException;

  /**
   * Marks the segment let go of by the backend, so that {@link #open} opens nothing more; a
   * subclass frees what the daemon holds after it (under this monitor where a concurrent
   * {@link #openLive} must not see it half freed).
   *
   * @return false when it already was
   */
  protected final synchronized boolean markGone() {
    if (gone) {
      return false;
    }
    gone = true;
    return true;
  }

  /** Wraps a number native code opened for this process; {@link SegmentFd#ofNative} in the daemon. */
  @FunctionalInterface
  public interface Wrapper {
    SegmentFd wrap(int number, boolean readOnly) throws IOException;
  }

  /**
   * A descriptor that owns {@code fd}, or an exception with {@code fd} closed: nothing between
   * opening a number and its owner may leak it (a leaked descriptor of a segment keeps its memory
   * alive outside every budget, and counts against RLIMIT_NOFILE for good).
   */
  public static SegmentFd own(int fd, boolean readOnly, Wrapper wrapper) throws IOException {
    try {
      return wrapper.wrap(fd, readOnly);
    } catch (IOException | RuntimeException | Error e) {
      Descriptors.closeQuietly(fd); // no Java object owns the number yet
      throw e;
    }
  }
}
