package io.gpumemd.client;

import com.sun.jna.Pointer;
import io.gpumemd.common.unix.Descriptors;
import java.io.IOException;
import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * A host segment mapped read-write, or read-only for read-only holds on shared blocks (a
 * separate mapping: a read-only hold never sees the writable one, and writes through its
 * buffers throw {@link java.nio.ReadOnlyBufferException}). The daemon owns the segment; this
 * process maps it, so both see the same bytes. The segment comes as a shared-memory file's path
 * ({@code --host-segments path}) or as a descriptor from the fd channel ({@code fd}: {@link
 * #ofDescriptor}, mapped with {@code mmap} since the JDK cannot map a raw descriptor; a
 * read-only grant's descriptor is O_RDONLY and mapped PROT_READ, so not even this process's
 * native code could write through it).
 *
 * <p>Nothing is mapped before the file's real size (its {@code fstat}, or the descriptor's {@code
 * lseek} to its end) is checked against the segment_bytes the daemon gave ({@link ReplyCheck#segmentSize}): a mapping longer than its file
 * faults (SIGBUS) where it is touched past the end, and a writable map of a path would grow the
 * daemon's file.
 *
 * <p>Unmapping is immediate on {@link #close()} rather than left to the garbage collector. A
 * mapping never closed (an abandoned session's) is unmapped by the collector once no buffer
 * derived from it is reachable: a path mapping by the JDK's own cleaner, a descriptor mapping
 * by {@link #CLEANER} (every slice of a direct buffer keeps its base buffer reachable).
 *
 * <p>Thread-safe: {@link #slice} and {@link #close()} are synchronized.
 */
final class HostMapping implements SegmentMapping {
  private static final Cleaner CLEANER = Cleaner.create();

  private final ByteBuffer buffer;
  private final boolean readOnly;
  private final Runnable unmap;
  private boolean closed;

  HostMapping(String path, long segmentBytes) {
    this(path, segmentBytes, false);
  }

  HostMapping(String path, long segmentBytes, boolean readOnly) {
    this.readOnly = readOnly;
    checkSize(segmentBytes);
    MappedByteBuffer mapped;
    try (FileChannel channel = readOnly ? FileChannel.open(Path.of(path), StandardOpenOption.READ)
        : FileChannel.open(Path.of(path), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      // Before mapping: a writable map of more than the file grows the daemon's file, and
      // touching a mapping past a file's end is SIGBUS.
      ReplyCheck.segmentSize("host segment file " + path, channel.size(), "the lease's reply", segmentBytes);
      mapped = channel.map(readOnly ? FileChannel.MapMode.READ_ONLY : FileChannel.MapMode.READ_WRITE, 0, segmentBytes);
    } catch (IOException e) {
      throw new GpuMemException(io.grpc.Status.Code.FAILED_PRECONDITION,
          "cannot map " + path + ": " + e.getMessage() + " (is this process allowed to open the daemon's shm-dir?)", e);
    }
    this.buffer = mapped;
    this.unmap = () -> Unmapper.unmap(mapped);
  }

  private HostMapping(ByteBuffer buffer, boolean readOnly, Runnable unmap) {
    this.buffer = buffer;
    this.readOnly = readOnly;
    this.unmap = unmap;
  }

  /**
   * Maps a segment's descriptor whole ({@code MAP_SHARED}; read-only when the grant says so).
   * The caller closes the descriptor (the mapping does not need it).
   */
  static HostMapping ofDescriptor(ReceivedDescriptor descriptor) {
    long bytes = descriptor.segmentBytes();
    checkSize(bytes);
    // Touching a mapping past the end of the file behind the descriptor is SIGBUS: the file's
    // own size must be what the grant says, before anything is mapped.
    long actual;
    try {
      actual = Descriptors.size(descriptor.number());
    } catch (IOException e) {
      throw new GpuMemException(io.grpc.Status.Code.INTERNAL, "cannot fstat the descriptor of segment "
          + Long.toUnsignedString(descriptor.segmentId()) + ": " + e.getMessage(), e);
    }
    ReplyCheck.segmentSize("the descriptor of segment " + Long.toUnsignedString(descriptor.segmentId()) + " (fstat)",
        actual, "the fd channel's grant", bytes);
    Pointer address;
    try {
      address = Descriptors.mapShared(descriptor.number(), bytes, descriptor.readOnly());
    } catch (IOException e) {
      throw new GpuMemException(io.grpc.Status.Code.INTERNAL, "cannot map the descriptor of segment "
          + descriptor.segmentId() + " (" + bytes + " bytes" + (descriptor.readOnly() ? ", read-only" : "")
          + "): " + e.getMessage(), e);
    }
    ByteBuffer base = address.getByteBuffer(0, bytes);
    // The action must not refer to the buffer (it would never become unreachable).
    Cleaner.Cleanable cleanable = CLEANER.register(base, () -> Descriptors.unmap(address, bytes));
    return new HostMapping(descriptor.readOnly() ? base.asReadOnlyBuffer() : base, descriptor.readOnly(),
        cleanable::clean);
  }

  private static void checkSize(long segmentBytes) {
    if (segmentBytes > Integer.MAX_VALUE) {
      throw new GpuMemException(io.grpc.Status.Code.UNIMPLEMENTED, "host segment of " + segmentBytes
          + " bytes cannot be mapped as one ByteBuffer (limit 2 GiB - 1)", null);
    }
  }

  /** True for a read-only mapping. */
  boolean readOnly() {
    return readOnly;
  }

  /** A view of {@code [offset, offset + length)} (read-only for a read-only mapping). */
  synchronized ByteBuffer slice(long offset, long length) {
    if (closed) {
      throw new IllegalStateException("segment mapping is closed");
    }
    return buffer.slice((int) offset, (int) length);
  }

  @Override
  public synchronized void close() {
    if (closed) {
      return;
    }
    closed = true;
    unmap.run();
  }
}
