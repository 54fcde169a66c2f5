package io.gpumemd.it.e2e;

import com.sun.jna.Native;
import com.sun.jna.Pointer;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ReadOnlyBufferException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * A second process of the same tenant for {@link FdSegmentProcessTest}: {@code TARGET NAME SIZE
 * WRITE}: looks up the object published under NAME (a hold on another process's block), maps it
 * through the fd channel, reports the bytes found there and the mapping (read-only or not, its
 * permissions in {@code /proc/self/maps}, descriptors fetched), then writes the byte WRITE over
 * the block, or for a read-only hold tries to and reports the refusal. Prints one line {@code
 * RESULT key=value ...}.
 */
public final class FdPeerMain {
  private FdPeerMain() {}

  public static void main(String[] args) throws IOException {
    String target = args[0];
    String name = args[1];
    int size = Integer.parseInt(args[2]);
    byte write = (byte) Integer.parseInt(args[3]);
    try (GpuMemClient client = GpuMemClient.builder(target).clientName("fd-peer").connect();
         Lease hold = client.lookup(name)) {
      ByteBuffer buffer = hold.buffer();
      byte first = buffer.get(0);
      boolean uniform = true;
      for (int i = 0; i < size; i++) {
        uniform &= buffer.get(i) == first;
      }
      String written;
      try {
        for (int i = 0; i < size; i++) {
          buffer.put(i, write);
        }
        written = "true";
      } catch (ReadOnlyBufferException e) {
        written = "refused";
      }
      long address = Pointer.nativeValue(Native.getDirectBufferPointer(buffer));
      System.out.println("RESULT first=" + (first & 0xff) + " uniform=" + uniform + " readOnly=" + buffer.isReadOnly()
          + " written=" + written + " path=" + (hold.hostShmPath() == null ? "none" : hold.hostShmPath())
          + " perms=" + permissions(address) + " fetched=" + client.fdChannel().fetched()
          + " mapsOpened=" + client.mapsOpened());
    }
  }

  /** The permissions ({@code r--s}, {@code rw-s}) of the mapping that holds {@code address}. */
  private static String permissions(long address) throws IOException {
    for (String line : Files.readAllLines(Path.of("/proc/self/maps"))) {
      String[] fields = line.split("\\s+");
      String[] range = fields[0].split("-");
      long start = Long.parseUnsignedLong(range[0], 16);
      long end = Long.parseUnsignedLong(range[1], 16);
      if (Long.compareUnsigned(address, start) >= 0 && Long.compareUnsigned(address, end) < 0) {
        return fields[1];
      }
    }
    return "unmapped";
  }
}
