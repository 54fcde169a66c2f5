package io.gpumemd.client;

import com.sun.jna.Pointer;
import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.ReservedRange;
import io.grpc.Status;
import java.io.IOException;
import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;

/**
 * A host segment mapped read-write, or read-only for read-only holds on shared blocks (a
 * separate mapping: a read-only hold never sees the writable one, and writes through its
 * buffers throw {@link java.nio.ReadOnlyBufferException}; the pages are mapped {@code PROT_READ},
 * so not even this process's native code could write through them). The daemon owns the
 * segment; this process maps it, so both see the same bytes. The segment comes as a
 * shared-memory file's path ({@code --host-segments path}, opened here) or as a descriptor from
 * the fd channel ({@code fd}: {@link #ofDescriptor}; a read-only grant's descriptor is O_RDONLY).
 *
 * <p>The segment sits in an address range of its own ({@link ReservedRange}): the range is
 * reserved inaccessible, then the segment mapped over it at that address (the JDK cannot map at
 * an address, so both kinds are mapped with {@code mmap}, and the buffers made from the address).
 * {@link #vacate} lets the segment go while keeping the range, and {@link #refill} maps a segment
 * of the same size there again: every buffer made from the mapping keeps its address through
 * both, which is what sleep and wake are built on. While vacated, touching the memory faults
 * (SIGSEGV, which ends the JVM): the caller makes sure nothing does.
 *
 * <p>Nothing is mapped before the file's real size (its {@code lseek} to its end) is checked
 * against the segment_bytes the daemon gave ({@link ReplyCheck#segmentSize}): touching a mapping
 * past its file's end is SIGBUS.
 *
 * <p>Unmapping is immediate on {@link #close()} rather than left to the garbage collector. A
 * mapping never closed (an abandoned session's) is unmapped by {@link #CLEANER} once no buffer
 * derived from it is reachable (every slice of a direct buffer keeps its base buffer reachable).
 *
 * <p>Thread-safe: the methods that use or change the mapping are synchronized.
 */
final class HostMapping implements SegmentMapping {
  private static final Cleaner CLEANER = Cleaner.create();

  private final ReservedRange range;
  private final ByteBuffer buffer;
  private final boolean readOnly;
  private final Cleaner.Cleanable unmap;
  private boolean closed;
  private boolean vacated;

  HostMapping(String path, long segmentBytes) {
    this(path, segmentBytes, false);
  }

  HostMapping(String path, long segmentBytes, boolean readOnly) {
    this(mapPath(path, segmentBytes, readOnly), readOnly);
  }

  private HostMapping(ReservedRange range, boolean readOnly) {
    this.range = range;
    this.readOnly = readOnly;
    Pointer address = range.address();
    long bytes = range.length();
    ByteBuffer base = address.getByteBuffer(0, bytes);
    // The action must not refer to the buffer (it would never become unreachable).
    this.unmap = CLEANER.register(base, () -> ReservedRange.release(address, bytes));
    this.buffer = readOnly ? base.asReadOnlyBuffer() : base;
  }

  /**
   * Maps a segment's descriptor whole ({@code MAP_SHARED}; read-only when the grant says so).
   * The caller closes the descriptor (the mapping does not need it).
   */
  static HostMapping ofDescriptor(ReceivedDescriptor descriptor) {
    long bytes = descriptor.segmentBytes();
    checkSize(bytes);
    checkDescriptorSize(descriptor, bytes);
    try {
      return new HostMapping(mapOver(descriptor.number(), bytes, descriptor.readOnly()), descriptor.readOnly());
    } catch (IOException e) {
      throw new GpuMemException(Status.Code.INTERNAL, "cannot map the descriptor of segment "
          + descriptor.segmentId() + " (" + bytes + " bytes" + (descriptor.readOnly() ? ", read-only" : "")
          + "): " + e.getMessage(), e);
    }
  }

  private static ReservedRange mapPath(String path, long segmentBytes, boolean readOnly) {
    checkSize(segmentBytes);
    int fd = openPath(path, readOnly);
    try {
      checkPathSize(path, fd, "the lease's reply", segmentBytes);
      return mapOver(fd, segmentBytes, readOnly);
    } catch (IOException e) {
      throw cannotMap(path, e);
    } finally {
      Descriptors.closeQuietly(fd); // the mapping does not need it
    }
  }

  private static int openPath(String path, boolean readOnly) {
    try {
      return Descriptors.open(path, readOnly);
    } catch (IOException e) {
      throw cannotMap(path, e);
    }
  }

  private static GpuMemException cannotMap(String path, IOException e) {
    return new GpuMemException(Status.Code.FAILED_PRECONDITION,
        "cannot map " + path + ": " + e.getMessage() + " (is this process allowed to open the daemon's shm-dir?)", e);
  }

  /** Before mapping: touching a mapping past its file's end is SIGBUS. */
  private static void checkPathSize(String path, int fd, String source, long segmentBytes) throws IOException {
    ReplyCheck.segmentSize("host segment file " + path, Descriptors.size(fd), source, segmentBytes);
  }

  private static void checkDescriptorSize(ReceivedDescriptor descriptor, long bytes) {
    long actual;
    try {
      actual = Descriptors.size(descriptor.number());
    } catch (IOException e) {
      throw new GpuMemException(Status.Code.INTERNAL, "cannot fstat the descriptor of segment "
          + Long.toUnsignedString(descriptor.segmentId()) + ": " + e.getMessage(), e);
    }
    ReplyCheck.segmentSize("the descriptor of segment " + Long.toUnsignedString(descriptor.segmentId()) + " (fstat)",
        actual, "the fd channel's grant", bytes);
  }

  /** A new reservation with the file behind {@code fd} mapped over it; nothing left on a failure. */
  private static ReservedRange mapOver(int fd, long bytes, boolean readOnly) throws IOException {
    ReservedRange range = ReservedRange.reserve(bytes);
    try {
      range.fill(fd, readOnly);
    } catch (IOException | RuntimeException e) {
      ReservedRange.release(range.address(), bytes);
      throw e;
    }
    return range;
  }

  private static void checkSize(long segmentBytes) {
    if (segmentBytes > Integer.MAX_VALUE) {
      throw new GpuMemException(Status.Code.UNIMPLEMENTED, "host segment of " + segmentBytes
          + " bytes cannot be mapped as one ByteBuffer (limit 2 GiB - 1)", null);
    }
  }

  /** True for a read-only mapping. */
  boolean readOnly() {
    return readOnly;
  }

  /** The address of the mapping's first byte in this process: the same from mapping to close. */
  long address() {
    return Pointer.nativeValue(range.address());
  }

  /** The segment's size in bytes. */
  long bytes() {
    return range.length();
  }

  /**
   * A view of {@code [offset, offset + length)} (read-only for a read-only mapping). Made also
   * while vacated (its address is the range's): touching it then faults.
   */
  synchronized ByteBuffer slice(long offset, long length) {
    checkOpen();
    return buffer.slice((int) offset, (int) length);
  }

  @Override
  public boolean vacatable() {
    return true;
  }

  /** True between {@link #vacate} and {@link #refill}. */
  synchronized boolean vacated() {
    return vacated;
  }

  /**
   * Lets the segment go and keeps its address range, inaccessible: this process no longer maps
   * the segment (the daemon may free it), and every buffer made from this mapping keeps its
   * address for {@link #refill}. Touching them meanwhile faults. Does nothing when vacated.
   */
  @Override
  public synchronized void vacate() {
    checkOpen();
    if (vacated) {
      return;
    }
    try {
      range.vacate();
    } catch (IOException e) {
      throw new GpuMemException(Status.Code.INTERNAL, "cannot vacate the " + range.length()
          + "-byte mapping at 0x" + Long.toHexString(address()) + ": " + e.getMessage(), e);
    }
    vacated = true;
  }

  /**
   * Maps the host segment file at {@code path} over this mapping's range (the same segment or
   * another of the same size), with this mapping's access: every buffer made from it sees that
   * segment's bytes at the address it had. Whatever was mapped there is replaced in one step. On
   * a failure the range is as it was.
   */
  synchronized void refill(String path) {
    checkOpen();
    int fd = openPath(path, readOnly);
    try {
      checkPathSize(path, fd, "the mapping it refills", range.length());
      range.fill(fd, readOnly);
    } catch (IOException e) {
      throw cannotMap(path, e);
    } finally {
      Descriptors.closeQuietly(fd);
    }
    vacated = false;
  }

  /**
   * {@link #refill(String)} from a segment's descriptor, which stays the caller's to close. A
   * writable mapping cannot be refilled from a read-only grant; a read-only mapping stays
   * read-only whatever the descriptor allows.
   */
  synchronized void refill(ReceivedDescriptor descriptor) {
    checkOpen();
    if (descriptor.readOnly() && !readOnly) {
      throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "segment " + Long.toUnsignedString(
          descriptor.segmentId()) + " is granted read-only: it cannot refill a writable mapping", null);
    }
    ReplyCheck.segmentSize("the grant of segment " + Long.toUnsignedString(descriptor.segmentId()),
        descriptor.segmentBytes(), "the mapping it refills", range.length());
    checkDescriptorSize(descriptor, range.length());
    try {
      range.fill(descriptor.number(), readOnly);
    } catch (IOException e) {
      throw new GpuMemException(Status.Code.INTERNAL, "cannot map the descriptor of segment "
          + descriptor.segmentId() + " at 0x" + Long.toHexString(address()) + ": " + e.getMessage(), e);
    }
    vacated = false;
  }

  private void checkOpen() {
    if (closed) {
      throw new IllegalStateException("segment mapping is closed");
    }
  }

  /** Unmaps the whole range, segment or reservation. */
  @Override
  public synchronized void close() {
    if (closed) {
      return;
    }
    closed = true;
    unmap.clean();
  }
}
