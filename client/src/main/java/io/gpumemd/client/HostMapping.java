package io.gpumemd.client;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * A host segment's shared-memory file mapped read-write, or read-only for read-only holds on
 * shared blocks (a separate mapping of the same file: a read-only hold never sees the writable
 * one, and writes through its buffers throw {@link java.nio.ReadOnlyBufferException}). The
 * daemon owns the file; this process maps it, so both see the same bytes.
 *
 * <p>Unmapping is immediate ({@link Unmapper}) rather than left to the garbage collector.
 */
final class HostMapping implements SegmentMapping {
  private final MappedByteBuffer buffer;
  private final boolean readOnly;
  private boolean closed;

  HostMapping(String path, long segmentBytes) {
    this(path, segmentBytes, false);
  }

  HostMapping(String path, long segmentBytes, boolean readOnly) {
    this.readOnly = readOnly;
    if (segmentBytes > Integer.MAX_VALUE) {
      throw new GpuMemException(io.grpc.Status.Code.UNIMPLEMENTED, "host segment of " + segmentBytes
          + " bytes cannot be mapped as one ByteBuffer (limit 2 GiB - 1)", null);
    }
    try (FileChannel channel = readOnly ? FileChannel.open(Path.of(path), StandardOpenOption.READ)
        : FileChannel.open(Path.of(path), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      buffer = channel.map(readOnly ? FileChannel.MapMode.READ_ONLY : FileChannel.MapMode.READ_WRITE, 0, segmentBytes);
    } catch (IOException e) {
      throw new GpuMemException(io.grpc.Status.Code.FAILED_PRECONDITION,
          "cannot map " + path + ": " + e.getMessage() + " (is this process allowed to open the daemon's shm-dir?)", e);
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
    Unmapper.unmap(buffer);
  }
}
