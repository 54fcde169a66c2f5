package io.gpumemd.client;

import io.gpumemd.common.unix.Descriptors;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A segment's file descriptor received from the daemon's fd channel ({@link FdChannelClient}),
 * and what its grant says: the bytes to map and whether the mapping must be read-only. The
 * receiver owns it: map or import it, then close it (a mapping, host or CUDA VMM, stays valid
 * after its descriptor is closed).
 *
 * <p>Thread-safe: {@link #close()} closes the descriptor once; {@link #number()} after that
 * throws rather than hand out a number the process may have reused for another file.
 */
public final class ReceivedDescriptor implements AutoCloseable {
  private static final int CLOSED = -1;

  private final AtomicInteger number;
  private final long segmentId;
  private final long segmentBytes;
  private final boolean readOnly;

  ReceivedDescriptor(int number, long segmentId, long segmentBytes, boolean readOnly) {
    this.number = new AtomicInteger(number);
    this.segmentId = segmentId;
    this.segmentBytes = segmentBytes;
    this.readOnly = readOnly;
  }

  /**
   * The raw descriptor number in this process, e.g. for {@code cuMemImportFromShareableHandle}
   * (which does not take it over: close this afterwards).
   *
   * @throws IllegalStateException once closed
   */
  public int number() {
    int n = number.get();
    if (n == CLOSED) {
      throw new IllegalStateException("descriptor of segment " + segmentId + " is closed");
    }
    return n;
  }

  public long segmentId() {
    return segmentId;
  }

  /** Bytes of the segment: the length to map. */
  public long segmentBytes() {
    return segmentBytes;
  }

  /**
   * True when the mapping must be read-only: a host segment's descriptor is then O_RDONLY (the
   * kernel refuses a writable mapping); on CUDA VMM the importer sets read-only access itself.
   */
  public boolean readOnly() {
    return readOnly;
  }

  /**
   * Maps the whole host segment (read-only when {@link #readOnly()}), then closes the
   * descriptor: the mapping does not need it.
   */
  HostMapping mapHost() {
    try {
      return HostMapping.ofDescriptor(this);
    } finally {
      close();
    }
  }

  @Override
  public void close() {
    int n = number.getAndSet(CLOSED);
    if (n != CLOSED) {
      Descriptors.closeQuietly(n);
    }
  }
}
