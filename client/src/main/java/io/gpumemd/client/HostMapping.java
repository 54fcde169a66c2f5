package io.gpumemd.client;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * A host segment's shared-memory file mapped read-write. The daemon owns the file; this
 * process maps it, so both see the same bytes.
 *
 * <p>Unmapping is immediate ({@link Unmapper}) rather than left to the garbage collector.
 */
final class HostMapping implements SegmentMapping {
  private final MappedByteBuffer buffer;
  private boolean closed;

  HostMapping(String path, long segmentBytes) {
    if (segmentBytes > Integer.MAX_VALUE) {
      throw new GpuMemException(io.grpc.Status.Code.UNIMPLEMENTED, "host segment of " + segmentBytes
          + " bytes cannot be mapped as one ByteBuffer (limit 2 GiB - 1)", null);
    }
    try (FileChannel channel = FileChannel.open(Path.of(path), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      buffer = channel.map(FileChannel.MapMode.READ_WRITE, 0, segmentBytes);
    } catch (IOException e) {
      throw new GpuMemException(io.grpc.Status.Code.FAILED_PRECONDITION,
          "cannot map " + path + ": " + e.getMessage() + " (is this process allowed to open the daemon's shm-dir?)", e);
    }
  }

  /** A view of {@code [offset, offset + length)}. */
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
