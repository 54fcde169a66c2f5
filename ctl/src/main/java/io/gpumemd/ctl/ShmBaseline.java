package io.gpumemd.ctl;

import io.gpumemd.client.Unmapper;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicLong;

/**
 * What a process does for shared memory without gpumemd: per buffer, create a file in
 * /dev/shm, set its length, map it, touch every 4 KiB page (tmpfs allocates pages on first
 * touch, and that dominates the cost), unmap at once and delete the file. The load generator
 * compares it with gpumemd's hit path. Thread-safe (each call uses its own file).
 */
final class ShmBaseline {
  static final int PAGE = 4096;
  private final Path dir;
  private final String prefix = "gpumemd-loadgen-" + ProcessHandle.current().pid() + "-";
  private final AtomicLong sequence = new AtomicLong();

  ShmBaseline(Path dir) {
    if (!Unmapper.immediate()) {
      throw new IllegalStateException("sun.misc.Unsafe.invokeCleaner is not available: cannot unmap at once");
    }
    this.dir = dir;
  }

  /** One fresh buffer of {@code sizeBytes}, used and thrown away. */
  void oneBuffer(long sizeBytes) throws IOException {
    Path file = dir.resolve(prefix + sequence.incrementAndGet());
    MappedByteBuffer buffer;
    try (RandomAccessFile raf = new RandomAccessFile(file.toFile(), "rw")) {
      raf.setLength(sizeBytes);
      buffer = raf.getChannel().map(FileChannel.MapMode.READ_WRITE, 0, sizeBytes);
    }
    try {
      for (int i = 0; i < sizeBytes; i += PAGE) {
        buffer.put(i, (byte) 1);
      }
    } finally {
      Unmapper.unmap(buffer);
      Files.delete(file);
    }
  }
}
