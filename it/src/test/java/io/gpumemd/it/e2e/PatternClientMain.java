package io.gpumemd.it.e2e;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * A client process for end-to-end tests. Prints one line {@code RESULT key=value ...}.
 * <ul>
 *   <li>{@code write TARGET SIZE BYTE}: leases SIZE bytes on device 0, fills them with BYTE,
 *       releases, and exits.
 *   <li>{@code read TARGET SIZE}: leases SIZE bytes and reports whether they all hold one value.
 *   <li>{@code map PATH OFFSET SIZE}: no daemon at all: maps the shared-memory file named by a
 *       lease's handle and reports the bytes found there.
 * </ul>
 */
public final class PatternClientMain {
  private PatternClientMain() {}

  public static void main(String[] args) throws IOException {
    String mode = args[0];
    if (mode.equals("map")) {
      long offset = Long.parseLong(args[2]);
      int size = Integer.parseInt(args[3]);
      try (FileChannel channel = FileChannel.open(Path.of(args[1]), StandardOpenOption.READ)) {
        MappedByteBuffer buffer = channel.map(FileChannel.MapMode.READ_ONLY, offset, size);
        System.out.println("RESULT " + describe(buffer, size));
      }
      return;
    }
    long size = Long.parseLong(args[2]);
    try (GpuMemClient client = GpuMemClient.builder(args[1]).clientName("pattern-" + mode).connect();
         Lease lease = client.lease(0, size)) {
      String where = "segment=" + lease.segmentId() + " offset=" + lease.offset() + " hit=" + lease.poolHit();
      if (mode.equals("write")) {
        byte value = (byte) Integer.parseInt(args[3]);
        var buffer = lease.buffer();
        for (int i = 0; i < size; i++) {
          buffer.put(i, value);
        }
        System.out.println("RESULT " + where);
      } else {
        System.out.println("RESULT " + where + " " + describe(lease.buffer(), (int) size));
      }
    }
  }

  private static String describe(java.nio.ByteBuffer buffer, int size) {
    byte first = buffer.get(0);
    boolean uniform = true;
    for (int i = 0; i < size; i++) {
      uniform &= buffer.get(i) == first;
    }
    return "first=" + (first & 0xff) + " uniform=" + uniform;
  }
}
