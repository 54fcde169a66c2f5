package io.gpumemd.server.backend.host;

import com.sun.jna.Pointer;
import io.gpumemd.common.unix.AnonymousMemory;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.RangeCheckedHostBuffer;
import io.gpumemd.server.backend.SegmentMemory;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * The host backend's copies between segments and host buffers: a segment is a file (a path or a
 * memfd), so a copy is a positional read or write of the file through a direct view of the
 * buffer's anonymous memory, in chunks (a {@code ByteBuffer} holds at most 2 GiB). The page
 * cache does the rest: a read fills the buffer from the segment's pages, a write puts the bytes
 * in the pages every mapping of the segment shares.
 *
 * <p>Stateless and thread-safe.
 */
final class HostCopies {
  /** Bytes per read or write call: a view must fit an int, and 256 MiB keeps each call short. */
  private static final int CHUNK = 256 << 20;

  private HostCopies() {}

  /** Plain anonymous memory of the daemon. */
  static HostBuffer allocate(long bytes) {
    try {
      return new AnonymousBuffer(AnonymousMemory.map(bytes), bytes);
    } catch (IOException e) {
      throw new BackendOutOfMemoryException("cannot map " + bytes + " bytes of host memory to keep contents in: " + e.getMessage());
    }
  }

  static void toHost(SegmentMemory segment, long offset, HostBuffer host, long hostOffset, long length) {
    transfer(segment, offset, host, hostOffset, length, false);
  }

  static void fromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    transfer(segment, offset, host, hostOffset, length, true);
  }

  /**
   * Reads the segment's range into the buffer ({@code intoSegment} false) or writes the buffer's
   * bytes into it, on the segment's file: a memfd segment's channel, open for its life, or its
   * path opened for this copy and closed after it.
   */
  private static void transfer(SegmentMemory segment, long offset, HostBuffer host, long hostOffset, long length,
      boolean intoSegment) {
    AnonymousBuffer buffer = RangeCheckedHostBuffer.checked(host, AnonymousBuffer.class, hostOffset, length);
    try {
      if (segment instanceof HostFdSegment memfd) {
        transfer(memfd.channel(), offset, buffer, hostOffset, length, intoSegment); // within its size: the seals allow writes
        return;
      }
      Path path = ((HostSegment) segment).path();
      try (FileChannel channel = intoSegment ? FileChannel.open(path, StandardOpenOption.WRITE)
          : FileChannel.open(path, StandardOpenOption.READ)) {
        transfer(channel, offset, buffer, hostOffset, length, intoSegment);
      }
    } catch (IOException e) {
      throw new BackendException("host copy " + (intoSegment ? "into " : "out of ") + segment + ": " + e, e);
    }
  }

  private static void transfer(FileChannel channel, long offset, AnonymousBuffer buffer, long hostOffset, long length,
      boolean intoSegment) throws IOException {
    for (long done = 0; done < length; ) {
      ByteBuffer view = buffer.address.getByteBuffer(hostOffset + done, (int) Math.min(CHUNK, length - done));
      while (view.hasRemaining()) {
        long at = offset + done + view.position();
        if (intoSegment) {
          channel.write(view, at);
        } else if (channel.read(view, at) < 0) {
          throw new IOException("segment ends before " + (offset + length));
        }
      }
      done += view.capacity();
    }
  }

  /** Anonymous memory mapped by {@link AnonymousMemory}. */
  private static final class AnonymousBuffer extends RangeCheckedHostBuffer {
    private final Pointer address;

    AnonymousBuffer(Pointer address, long bytes) {
      super(bytes);
      this.address = address;
    }

    @Override
    protected void release() {
      AnonymousMemory.unmap(address, bytes());
    }
  }
}
