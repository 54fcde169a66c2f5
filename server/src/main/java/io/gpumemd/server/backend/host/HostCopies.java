package io.gpumemd.server.backend.host;

import com.sun.jna.Pointer;
import io.gpumemd.common.unix.AnonymousMemory;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.SegmentMemory;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.atomic.AtomicBoolean;

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
    AnonymousBuffer buffer = checked(host, hostOffset, length);
    copy(segment, false, channel -> {
      for (long done = 0; done < length; ) {
        ByteBuffer view = buffer.view(hostOffset + done, (int) Math.min(CHUNK, length - done));
        while (view.hasRemaining()) {
          if (channel.read(view, offset + done + view.position()) < 0) {
            throw new IOException("segment ends before " + (offset + length));
          }
        }
        done += view.capacity();
      }
    });
  }

  static void fromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    AnonymousBuffer buffer = checked(host, hostOffset, length);
    copy(segment, true, channel -> {
      for (long done = 0; done < length; ) {
        ByteBuffer view = buffer.view(hostOffset + done, (int) Math.min(CHUNK, length - done));
        while (view.hasRemaining()) {
          channel.write(view, offset + done + view.position());
        }
        done += view.capacity();
      }
    });
  }

  private interface ChannelCopy {
    void run(FileChannel channel) throws IOException;
  }

  /**
   * Runs a copy on the segment's file: a memfd segment's channel, open for its life, or its
   * path opened for this copy and closed after it.
   */
  private static void copy(SegmentMemory segment, boolean write, ChannelCopy copy) {
    try {
      if (segment instanceof HostFdSegment memfd) {
        copy.run(memfd.channel()); // within its size: the seals allow writes
        return;
      }
      Path path = ((HostSegment) segment).path();
      try (FileChannel channel = write ? FileChannel.open(path, StandardOpenOption.WRITE) : FileChannel.open(path, StandardOpenOption.READ)) {
        copy.run(channel);
      }
    } catch (IOException e) {
      throw new BackendException("host copy " + (write ? "into " : "out of ") + segment + ": " + e, e);
    }
  }

  private static AnonymousBuffer checked(HostBuffer host, long hostOffset, long length) {
    if (!(host instanceof AnonymousBuffer buffer)) {
      throw new BackendException("a host buffer of another backend: " + host);
    }
    if (hostOffset < 0 || length < 0 || hostOffset + length > buffer.bytes) {
      throw new BackendException("[" + hostOffset + ", +" + length + ") is outside a host buffer of " + buffer.bytes + " bytes");
    }
    return buffer;
  }

  /** Anonymous memory mapped by {@link AnonymousMemory}; unmapped once. */
  private static final class AnonymousBuffer implements HostBuffer {
    private final Pointer address;
    private final long bytes;
    private final AtomicBoolean freed = new AtomicBoolean();

    AnonymousBuffer(Pointer address, long bytes) {
      this.address = address;
      this.bytes = bytes;
    }

    ByteBuffer view(long offset, int length) {
      if (freed.get()) {
        throw new BackendException("host buffer used after it was freed");
      }
      return address.getByteBuffer(offset, length);
    }

    @Override
    public long bytes() {
      return bytes;
    }

    @Override
    public void free() {
      if (freed.compareAndSet(false, true)) {
        AnonymousMemory.unmap(address, bytes);
      }
    }

    @Override
    public String toString() {
      return "host buffer of " + bytes + " bytes";
    }
  }
}
