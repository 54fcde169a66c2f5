package io.gpumemd.it.bench;

import com.sun.jna.Pointer;
import io.gpumemd.common.unix.AnonymousMemory;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.offload.HostStore;
import io.gpumemd.server.offload.ParkedRange;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;

/**
 * What parking costs on the host backend, against the physical limit (issue 35's measure): a
 * segment of {@code GiB} (default 1) is parked in the host store and restored, alternating in
 * rounds with a plain copy of as many bytes both ways between two anonymous buffers (the JDK's
 * {@code copyMemory}, a memcpy). The segment's pages and the buffers are touched before the
 * rounds, so neither side pays first-touch page faults in its timings... except the park's own
 * host buffer, new each time as it would be in a daemon. A third contender is what sleep saves:
 * a new process that maps a fresh shared-memory file and fills it from a 1 GiB file of weights
 * (its pages in the page cache, the best case of a reload from disk). Prints per round and the
 * medians. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.HostStoreCostMain [GiB] [rounds]
 * </pre>
 */
public final class HostStoreCostMain {
  private static final long GIB = 1L << 30;
  private static final int CHUNK = 256 << 20;

  private HostStoreCostMain() {}

  public static void main(String[] args) throws Exception {
    long bytes = (args.length > 0 ? Long.parseLong(args[0]) : 1) * GIB;
    int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 5;
    Path dir = Files.createTempDirectory(Path.of("/dev/shm"), "gpumemd-hoststore-bench-");
    HostShmBackend backend = new HostShmBackend(dir.resolve("shm"), 1, bytes + GIB, null);
    Pointer a = AnonymousMemory.map(bytes);
    Pointer b = AnonymousMemory.map(bytes);
    Path weights = Files.createTempFile("gpumemd-weights-", ".bin"); // on disk, in the page cache once written
    try {
      SegmentMemory segment = backend.allocate(0, bytes, SegmentOwner.DAEMON);
      fill(Path.of(((IpcHandle.HostShm) segment.handle()).path()), bytes);
      touch(a, bytes);
      touch(b, bytes);
      HostStore store = new HostStore(backend, bytes);
      double[] park = new double[rounds];
      double[] restore = new double[rounds];
      double[] memcpy = new double[rounds];
      double[] reload = new double[rounds];
      fill(weights, bytes);
      for (int r = 0; r < rounds; r++) {
        long t0 = System.nanoTime();
        copy(a, b, bytes);
        copy(b, a, bytes);
        memcpy[r] = (System.nanoTime() - t0) / 1e6;

        ParkedRange parked;
        long t1 = System.nanoTime();
        try (HostStore.Claim claim = store.claim(bytes, "bench")) {
          parked = claim.park(segment, 0, bytes);
        }
        long t2 = System.nanoTime();
        parked.restoreInto(segment, 0);
        long t3 = System.nanoTime();
        parked.drop();
        reload[r] = reload(weights, dir.resolve("reloaded"), bytes);
        park[r] = (t2 - t1) / 1e6;
        restore[r] = (t3 - t2) / 1e6;
        System.out.printf("round %d: memcpy both ways %.0f ms, park %.0f ms + restore %.0f ms = %.0f ms (%.2fx),"
            + " a new process's reload %.0f ms%n",
            r + 1, memcpy[r], park[r], restore[r], park[r] + restore[r], (park[r] + restore[r]) / memcpy[r], reload[r]);
      }
      double m = median(memcpy);
      double p = median(park);
      double s = median(restore);
      System.out.printf("median of %d rounds, %d GiB: memcpy both ways %.0f ms (%.1f GB/s each way); park %.0f ms, restore %.0f ms,"
          + " together %.0f ms = %.2fx memcpy; a new process's reload from a cached file %.0f ms (restore alone: %.2fx faster)%n",
          rounds, bytes / GIB, m, 2 * bytes / m / 1e6, p, s, p + s, (p + s) / m, median(reload), median(reload) / s);
    } finally {
      AnonymousMemory.unmap(a, bytes);
      AnonymousMemory.unmap(b, bytes);
      backend.close();
      Files.deleteIfExists(weights);
      Files.deleteIfExists(dir.resolve("shm"));
      Files.deleteIfExists(dir);
    }
  }

  /** A new Python process: maps a fresh file in /dev/shm and reads the weights into it; wall time from spawn to exit. */
  static double reload(Path weights, Path target, long bytes) throws Exception {
    String script = "import mmap,os,sys\n"
        + "n=int(sys.argv[3]); fd=os.open(sys.argv[2], os.O_RDWR|os.O_CREAT, 0o600); os.ftruncate(fd, n)\n"
        + "m=mmap.mmap(fd, n); f=open(sys.argv[1], 'rb', buffering=0); v=memoryview(m); done=0\n"
        + "while done < n: done += f.readinto(v[done:done + (64 << 20)])\n"
        + "v.release(); m.close(); os.close(fd); os.unlink(sys.argv[2])\n";
    long start = System.nanoTime();
    Process process = new ProcessBuilder("python3", "-c", script, weights.toString(), target.toString(), Long.toString(bytes))
        .inheritIO().start();
    if (process.waitFor() != 0) {
      throw new IllegalStateException("the reload process failed");
    }
    return (System.nanoTime() - start) / 1e6;
  }

  static void copy(Pointer from, Pointer to, long bytes) {
    for (long done = 0; done < bytes; done += CHUNK) {
      int n = (int) Math.min(CHUNK, bytes - done);
      to.getByteBuffer(done, n).put(from.getByteBuffer(done, n));
    }
  }

  static void touch(Pointer p, long bytes) {
    for (long done = 0; done < bytes; done += CHUNK) {
      ByteBuffer view = p.getByteBuffer(done, (int) Math.min(CHUNK, bytes - done));
      while (view.remaining() >= 8) {
        view.putLong(0x5a5a5a5a5a5a5a5aL);
      }
    }
  }

  static void fill(Path file, long bytes) throws Exception {
    byte[] chunk = new byte[1 << 20];
    Arrays.fill(chunk, (byte) 7);
    try (FileChannel channel = FileChannel.open(file, StandardOpenOption.WRITE, StandardOpenOption.CREATE)) {
      for (long done = 0; done < bytes; done += chunk.length) {
        ByteBuffer buffer = ByteBuffer.wrap(chunk);
        while (buffer.hasRemaining()) {
          channel.write(buffer, done + buffer.position());
        }
      }
    }
  }

  static double median(double[] values) {
    double[] sorted = values.clone();
    Arrays.sort(sorted);
    return sorted[sorted.length / 2];
  }
}
