package io.gpumemd.it.bench;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.testing.DaemonProcess;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Host segments by path against by descriptor ({@code --host-segments path|fd}) for the Java
 * client, in one run: two daemons in JVMs of their own, one per mode, rounds alternating
 * between them and which goes first (as {@code python/bench/fd_bench.py} does, whose figures it
 * complements). Per round and mode:
 *
 * <ul>
 *   <li>first lease, miss: a new client leases {@value #SEGMENTS} blocks of 2 MiB, each a new
 *       segment the daemon makes and backs, which this client maps first;
 *   <li>first lease, hit: a second new client leases as many, each a cached segment new to it
 *       (by path: open + mmap; by descriptor: a round trip on the fd channel + mmap);
 *   <li>lease+release: a pool hit on a segment already mapped (1 MiB on the session stream, the
 *       client cache tier off so that every lease reaches the daemon).
 * </ul>
 *
 * Per lease call, the caller's view; pages are not touched. Prints p50 and p90. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.FdCostMain [rounds]
 * </pre>
 */
public final class FdCostMain {
  private static final long MIB = 1L << 20;
  private static final int SEGMENTS = 20;
  private static final int PAIRS = 2000;

  private FdCostMain() {}

  public static void main(String[] args) throws Exception {
    int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 10;
    Map<String, DaemonProcess> daemons = new LinkedHashMap<>();
    Map<String, Map<String, List<Long>>> samples = new LinkedHashMap<>();
    try {
      for (String mode : List.of("path", "fd")) {
        daemons.put(mode, DaemonProcess.start("--host-segments", mode, "--host-devices", "1",
            "--host-device-bytes", "512MiB"));
        samples.put(mode, Map.of("miss", new ArrayList<>(), "hit", new ArrayList<>(), "pair", new ArrayList<>()));
      }
      Map<String, GpuMemClient> pairClients = new LinkedHashMap<>();
      for (Map.Entry<String, DaemonProcess> d : daemons.entrySet()) {
        pairClients.put(d.getKey(), GpuMemClient.builder(d.getValue().unixTarget()).clientName("bench-pairs")
            .clientCacheBytes(0).connect());
      }
      // warm-up: both JVMs on every path, both modes
      for (String mode : daemons.keySet()) {
        pairs(pairClients.get(mode), PAIRS);
        firstLeases(daemons.get(mode).unixTarget(), new ArrayList<>(), new ArrayList<>());
      }
      for (int round = 0; round < rounds; round++) {
        List<String> order = new ArrayList<>(daemons.keySet());
        if (round % 2 == 1) {
          java.util.Collections.reverse(order);
        }
        for (String mode : order) {
          Map<String, List<Long>> s = samples.get(mode);
          firstLeases(daemons.get(mode).unixTarget(), s.get("miss"), s.get("hit"));
          s.get("pair").addAll(pairs(pairClients.get(mode), PAIRS));
        }
      }
      pairClients.values().forEach(GpuMemClient::close);
    } finally {
      daemons.values().forEach(DaemonProcess::close);
    }
    System.out.printf("%-40s %12s %12s %12s %12s%n", "Java client, per lease call", "path p50 us", "fd p50 us",
        "path p90 us", "fd p90 us");
    for (String[] row : new String[][] {{"miss", "first lease, miss (new segment)"},
        {"hit", "first lease, hit (segment new here)"}, {"pair", "lease+release, mapped segment"}}) {
      long[] path = sorted(samples.get("path").get(row[0]));
      long[] fd = sorted(samples.get("fd").get(row[0]));
      System.out.printf("%-40s %12.1f %12.1f %12.1f %12.1f%n", row[1], q(path, 0.5), q(fd, 0.5), q(path, 0.9),
          q(fd, 0.9));
    }
    System.out.printf("(%d rounds; %d first leases and %d pairs per mode)%n", rounds,
        samples.get("fd").get("miss").size(), samples.get("fd").get("pair").size());
  }

  /** A first client's leases (misses), then a second one's on the same segments (hits), then a trim. */
  private static void firstLeases(String target, List<Long> misses, List<Long> hits) {
    List<Lease> held = new ArrayList<>();
    try (GpuMemClient first = GpuMemClient.builder(target).clientName("bench-first").clientCacheBytes(0).connect()) {
      for (int i = 0; i < SEGMENTS; i++) {
        long started = System.nanoTime();
        held.add(first.lease(0, 2 * MIB));
        misses.add(System.nanoTime() - started);
      }
      held.forEach(Lease::close);
    }
    held.clear();
    try (GpuMemClient second = GpuMemClient.builder(target).clientName("bench-second").clientCacheBytes(0).connect()) {
      for (int i = 0; i < SEGMENTS; i++) {
        long started = System.nanoTime();
        held.add(second.lease(0, 2 * MIB));
        hits.add(System.nanoTime() - started);
      }
      if (!held.stream().allMatch(Lease::poolHit) || second.mapsOpened() != SEGMENTS) {
        throw new IllegalStateException("the second client should hit the first one's segments, each new to it");
      }
      held.forEach(Lease::close);
      AdminGrpc.newBlockingStub(second.connection().channel())
          .trim(TrimRequest.newBuilder().setDevice(0).setKeepBytes(0).build());
    }
  }

  private static List<Long> pairs(GpuMemClient client, int n) {
    List<Long> times = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      long started = System.nanoTime();
      client.lease(0, MIB).close();
      times.add(System.nanoTime() - started);
    }
    return times;
  }

  private static long[] sorted(List<Long> times) {
    long[] a = times.stream().mapToLong(Long::longValue).toArray();
    Arrays.sort(a);
    return a;
  }

  private static double q(long[] sorted, double q) {
    return sorted[Math.min(sorted.length - 1, (int) (sorted.length * q))] / 1000.0;
  }
}
