package io.gpumemd.client;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The cost of mapping a host segment in a reserved address range (issue 35 item 1) against the
 * plain {@code FileChannel.map} it replaced, in one run: a segment's mapping is made on the first
 * lease on a new segment, so this is what the reservation adds to that path. Per size, a file of
 * that size in /dev/shm is mapped, sliced and unmapped {@code maps} times per round each way, the
 * two ways alternating (and which goes first) round by round:
 *
 * <ul>
 *   <li>plain: open a FileChannel, its size, {@code map(READ_WRITE)}, a 4 KiB slice, close the
 *       channel, {@link Unmapper#unmap} (the old HostMapping);
 *   <li>reserved: {@link HostMapping}: open, size, the PROT_NONE reservation, the segment mapped
 *       over it with MAP_FIXED, the direct buffer from its address and its cleaner, a 4 KiB
 *       slice, close (munmap).
 * </ul>
 *
 * <p>Pages are not touched (their first touch costs the same both ways). Prints the median
 * microseconds of one map+unmap per way and size (single operations: a preempted one on a loaded
 * machine does not move the median), and the ratio. Run with the client's test classpath:
 * {@code java -cp ... io.gpumemd.client.MappingCostMain [rounds] [maps] [MiB,MiB,...]}.
 */
public final class MappingCostMain {
  private static final long MIB = 1L << 20;

  private MappingCostMain() {}

  public static void main(String[] args) throws IOException {
    int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 7;
    int maps = args.length > 1 ? Integer.parseInt(args[1]) : 200;
    String sizes = args.length > 2 ? args[2] : "2,64,1024";
    System.out.printf("%8s %12s %12s %7s%n", "MiB", "plain us", "reserved us", "ratio");
    for (String size : sizes.split(",")) {
      long bytes = Long.parseLong(size) * MIB;
      Path file = Path.of("/dev/shm", "gpumemd-mapping-cost-" + ProcessHandle.current().pid());
      try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "rw")) {
        f.setLength(bytes);
      }
      try {
        List<Double> plain = new ArrayList<>();
        List<Double> reserved = new ArrayList<>();
        timed(true, file, bytes, 200, new ArrayList<>()); // warm-up, both ways
        timed(false, file, bytes, 200, new ArrayList<>());
        for (int r = 0; r < rounds; r++) {
          boolean plainFirst = r % 2 == 0;
          timed(plainFirst, file, bytes, maps, plainFirst ? plain : reserved);
          timed(!plainFirst, file, bytes, maps, plainFirst ? reserved : plain);
        }
        double p = median(plain);
        double v = median(reserved);
        System.out.printf("%8s %12.1f %12.1f %7.2f%n", size, p, v, v / p);
      } finally {
        Files.deleteIfExists(file);
      }
    }
  }

  private static void timed(boolean plain, Path file, long bytes, int maps, List<Double> into) throws IOException {
    for (int i = 0; i < maps; i++) {
      long start = System.nanoTime();
      if (plain) {
        plain(file, bytes);
      } else {
        reserved(file, bytes);
      }
      into.add((System.nanoTime() - start) / 1000.0);
    }
  }

  private static void plain(Path file, long bytes) throws IOException {
    MappedByteBuffer mapped;
    try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      if (channel.size() != bytes) {
        throw new IllegalStateException("size");
      }
      mapped = channel.map(FileChannel.MapMode.READ_WRITE, 0, bytes);
    }
    ByteBuffer slice = mapped.slice(0, 4096);
    if (slice.capacity() != 4096) {
      throw new IllegalStateException("slice");
    }
    Unmapper.unmap(mapped);
  }

  private static void reserved(Path file, long bytes) {
    HostMapping mapping = new HostMapping(file.toString(), bytes, false);
    if (mapping.slice(0, 4096).capacity() != 4096) {
      throw new IllegalStateException("slice");
    }
    mapping.close();
  }

  private static double median(List<Double> values) {
    List<Double> sorted = new ArrayList<>(values);
    Collections.sort(sorted);
    return sorted.get(sorted.size() / 2);
  }
}
