package io.gpumemd.it.bench;

import com.sun.jna.Native;
import com.sun.jna.Pointer;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.common.unix.AnonymousMemory;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.testing.DaemonProcess;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Sleep and wake of 1 GiB end to end (issue 35 item 7), on the host backend: a Java client in
 * this process leases {@code GiB} (default 1) as 128 MiB leases of a daemon in its own process,
 * fills them, and each round puts them to sleep at level 1 and wakes them (the daemon copies the
 * contents out to its host store and back; the client vacates and refills its mappings at the
 * same addresses), alternating with the physical limit: a plain copy of as many bytes both ways
 * between two anonymous buffers (memcpy). Also timed: the same at level 2 (no copies: the cost of
 * the protocol and the memory's round trip through the backend), and what a sleep saves, a new
 * process that maps a fresh file and fills it from a 1 GiB file in the page cache. Each wake is
 * checked: every lease at its old address with its bytes.
 *
 * <p>A fourth figure is the floor of a sleep that really frees the memory: the host backend's
 * own work, called directly, for as many segments (copy each out to a host buffer, free it, make
 * a new one, copy back), no protocol, no client. A memcpy between two ready buffers pays neither
 * the kernel's freeing of the pages nor its zeroing of new ones; the floor does, so {@code
 * sleep+wake ÷ floor} is what the daemon and the clients add, and {@code floor ÷ memcpy} what
 * giving the memory back costs on this machine. Prints per round and the medians. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.SleepWakeCostMain [GiB] [rounds]
 * </pre>
 */
public final class SleepWakeCostMain {
  private static final long GIB = 1L << 30;
  private static final int LEASE = 128 << 20;

  private SleepWakeCostMain() {}

  public static void main(String[] args) throws Exception {
    System.setProperty(DaemonProcess.FULL_JIT, "true"); // time what a deployed daemon runs
    long bytes = (args.length > 0 ? Long.parseLong(args[0]) : 1) * GIB;
    int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 5;
    Pointer a = AnonymousMemory.map(bytes);
    Pointer b = AnonymousMemory.map(bytes);
    Path weights = Files.createTempFile("gpumemd-weights-", ".bin");
    Path dir = Files.createTempDirectory(Path.of("/dev/shm"), "gpumemd-sleep-bench-");
    try (DaemonProcess daemon = DaemonProcess.start("--host-devices", "1", "--host-device-bytes",
        (bytes / GIB + 1) + "GiB", "--offload-max-bytes", (bytes / GIB + 1) + "GiB");
         GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName("bench-sleeper")
             .clientCacheBytes(0).connect()) {
      List<Lease> leases = new ArrayList<>();
      for (long done = 0; done < bytes; done += LEASE) {
        Lease lease = client.lease(0, LEASE, false, "weights");
        fill(lease.buffer(), done);
        leases.add(lease);
      }
      HostStoreCostMain.touch(a, bytes);
      HostStoreCostMain.touch(b, bytes);
      HostStoreCostMain.fill(weights, bytes);
      double[] memcpy = new double[rounds];
      double[] sleep = new double[rounds];
      double[] wake = new double[rounds];
      double[] level2 = new double[rounds];
      double[] reload = new double[rounds];
      double[] floor = new double[rounds];
      sleepAndWake(client, leases, 1); // warm-up: both JVMs' sleep and wake paths
      for (int r = 0; r < rounds; r++) {
        long t0 = System.nanoTime();
        HostStoreCostMain.copy(a, b, bytes);
        HostStoreCostMain.copy(b, a, bytes);
        memcpy[r] = (System.nanoTime() - t0) / 1e6;
        double[] level1 = sleepAndWake(client, leases, 1);
        sleep[r] = level1[0];
        wake[r] = level1[1];
        double[] two = sleepAndWake(client, leases, 2);
        level2[r] = two[0] + two[1];
        for (int i = 0; i < leases.size(); i++) {
          fill(leases.get(i).buffer(), (long) i * LEASE); // level 2 woke them zeroed
        }
        reload[r] = HostStoreCostMain.reload(weights, dir.resolve("reloaded"), bytes);
        floor[r] = floor(dir.resolve("floor"), bytes);
        System.out.printf("round %d: memcpy both ways %.0f ms; sleep %.0f ms + wake %.0f ms = %.0f ms (%.2fx);"
            + " the backend's floor %.0f ms; level 2 sleep+wake %.0f ms; a new process's reload %.0f ms%n", r + 1,
            memcpy[r], sleep[r], wake[r], sleep[r] + wake[r], (sleep[r] + wake[r]) / memcpy[r], floor[r], level2[r],
            reload[r]);
      }
      double m = HostStoreCostMain.median(memcpy);
      double s = HostStoreCostMain.median(sleep);
      double w = HostStoreCostMain.median(wake);
      System.out.printf("median of %d rounds, %d GiB in %d leases: memcpy both ways %.0f ms; sleep %.0f ms, wake %.0f ms,"
          + " together %.0f ms = %.2fx memcpy; level 2 sleep+wake %.0f ms; a new process's reload from a cached file"
          + " %.0f ms (wake alone: %.1fx faster)%n", rounds, bytes / GIB, leases.size(), m, s, w, s + w, (s + w) / m,
          HostStoreCostMain.median(level2), HostStoreCostMain.median(reload), HostStoreCostMain.median(reload) / w);
      double f = HostStoreCostMain.median(floor);
      System.out.printf("the backend's floor (copy out, free, new segment, copy in; no protocol) %.0f ms = %.2fx memcpy;"
          + " sleep+wake = %.2fx the floor%n", f, f / m, (s + w) / f);
      // The daemon's own account of each call (its log): where the time went.
      daemon.output().lines().filter(l -> l.contains(" sleeps at level ") || l.contains(" woke: "))
          .forEach(l -> System.out.println("  daemon: " + l.substring(l.indexOf("session "))));
    } finally {
      AnonymousMemory.unmap(a, bytes);
      AnonymousMemory.unmap(b, bytes);
      Files.deleteIfExists(weights);
      try (java.util.stream.Stream<Path> left = Files.walk(dir)) { // the floor's backend directories too
        for (Path p : left.sorted(java.util.Comparator.reverseOrder()).toList()) {
          Files.deleteIfExists(p);
        }
      }
    }
  }

  /**
   * The host backend's work for a sleep and wake of {@code bytes} in {@link #LEASE} segments,
   * called directly on a backend of its own (memfd segments, as the daemon's default): each
   * segment filled, then timed: copied out to a host buffer made beforehand (the daemon reuses
   * spare ones), freed, a new one made (the kernel zeroes and charges its pages) and the bytes
   * copied back in. Returns the timed part in ms.
   */
  private static double floor(Path shm, long bytes) {
    HostShmBackend backend = new HostShmBackend(shm, 1, bytes + GIB, null, shm.resolve("unused.sock").toString());
    List<HostBuffer> buffers = new ArrayList<>();
    List<SegmentMemory> segments = new ArrayList<>();
    try {
      for (long done = 0; done < bytes; done += LEASE) {
        SegmentMemory segment = backend.allocate(0, LEASE, SegmentOwner.DAEMON);
        HostBuffer buffer = backend.allocateHost(LEASE);
        backend.copyFromHost(buffer, 0, segment, 0, LEASE); // both sides' pages made before the clock
        segments.add(segment);
        buffers.add(buffer);
      }
      long t0 = System.nanoTime();
      for (int i = 0; i < segments.size(); i++) {
        backend.copyToHost(segments.get(i), 0, buffers.get(i), 0, LEASE);
        backend.free(segments.get(i));
        segments.set(i, backend.allocate(0, LEASE, SegmentOwner.DAEMON));
        backend.copyFromHost(buffers.get(i), 0, segments.get(i), 0, LEASE);
      }
      return (System.nanoTime() - t0) / 1e6;
    } finally {
      segments.forEach(backend::free);
      buffers.forEach(HostBuffer::free);
      backend.close();
    }
  }

  /** One sleep and wake at {@code level}, checked; returns {sleep ms, wake ms}. */
  private static double[] sleepAndWake(GpuMemClient client, List<Lease> leases, int level) {
    long[] addresses = new long[leases.size()];
    for (int i = 0; i < leases.size(); i++) {
      addresses[i] = Pointer.nativeValue(Native.getDirectBufferPointer(leases.get(i).buffer()));
    }
    long t0 = System.nanoTime();
    client.sleep(level);
    long t1 = System.nanoTime();
    client.wake();
    long t2 = System.nanoTime();
    for (int i = 0; i < leases.size(); i++) {
      ByteBuffer buffer = leases.get(i).buffer();
      if (Pointer.nativeValue(Native.getDirectBufferPointer(buffer)) != addresses[i]) {
        throw new IllegalStateException("lease " + i + " woke at another address");
      }
      long expected = level == 1 ? (long) i * LEASE : 0;
      if (buffer.getLong(0) != expected || buffer.getLong(LEASE - 8) != (level == 1 ? expected + LEASE - 8 : 0)) {
        throw new IllegalStateException("lease " + i + " woke with other bytes");
      }
    }
    return new double[] {(t1 - t0) / 1e6, (t2 - t1) / 1e6};
  }

  /** Writes each 8-byte word's own offset (from {@code base}): checkable anywhere. */
  private static void fill(ByteBuffer buffer, long base) {
    for (int i = 0; i + 8 <= buffer.capacity(); i += 8) {
      buffer.putLong(i, base + i);
    }
  }
}
