package io.gpumemd.it.bench;

import io.gpumemd.client.FdChannelClient;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.testing.DaemonProcess;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Host segments by path against by descriptor ({@code --host-segments path|fd}) for the Java
 * client, in one run: two daemons in JVMs of their own, one per mode, and by descriptor two
 * kinds of client (fd-fetch: asks for each segment, as clients before pushed descriptors did;
 * fd: its new segments pushed before their Lease replies), rounds alternating between the three
 * and which goes first (as {@code python/bench/fd_bench.py} does, whose figures it
 * complements). Per round and mode:
 *
 * <ul>
 *   <li>first lease, miss: a new client leases {@value #SEGMENTS} blocks of 2 MiB, each a new
 *       segment the daemon makes and backs, which this client maps first (the pool is emptied
 *       after each round, and a lease that is not a miss fails the run);
 *   <li>first lease, hit: a second new client leases as many, each a cached segment new to it
 *       (by path: open + mmap; by descriptor: a round trip on the fd channel + mmap);
 *   <li>lease+release: a pool hit on a segment already mapped (1 MiB on the session stream, the
 *       client cache tier off so that every lease reaches the daemon), by a new client per round
 *       that closes before the next phase: while this process keeps a connection to the fd
 *       channel open, every segment it was sent by descriptor stays pinned ({@code
 *       DescriptorPins}), and the pool would fill round by round.
 * </ul>
 *
 * Per lease call, the caller's view; pages are not touched. Prints p50 and p90, measured after
 * {@code warm-up} rounds of first leases (default 30), and the first leases of the first of them
 * apart ("cold": the code a first lease runs once per segment and process, still interpreted).
 * Last, a new daemon per mode and its first round of first leases ("new daemon"): this process's
 * client code is warm by then, so what is left of the cold figures there is the daemon's own.
 * Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.FdCostMain [rounds [warm-up]]
 * </pre>
 */
public final class FdCostMain {
  private static final long MIB = 1L << 20;
  private static final int SEGMENTS = 20;
  private static final int PAIRS = 2000;
  /** Descriptors pushed to the first-lease clients of the mode being measured. */
  private static final java.util.concurrent.atomic.AtomicLong PUSHED = new java.util.concurrent.atomic.AtomicLong();

  private FdCostMain() {}

  public static void main(String[] args) throws Exception {
    System.setProperty(DaemonProcess.FULL_JIT, "true"); // time what a deployed daemon runs
    int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 10;
    int warmUpRounds = args.length > 1 ? Integer.parseInt(args[1]) : 30;
    Map<String, Map<String, List<Long>>> cold = new LinkedHashMap<>();
    Map<String, DaemonProcess> daemons = new LinkedHashMap<>();
    Map<String, Map<String, List<Long>>> samples = new LinkedHashMap<>();
    Map<String, Long> pushedByMode = new LinkedHashMap<>();
    try {
      for (String mode : List.of("path", "fd")) {
        daemons.put(mode, DaemonProcess.start("--host-segments", mode, "--host-devices", "1",
            "--host-device-bytes", "512MiB"));
      }
      // "fd-fetch": the fd daemon, its clients asking for every segment (no pushed descriptors)
      daemons.put("fd-fetch", daemons.get("fd"));
      for (String mode : daemons.keySet()) {
        samples.put(mode, Map.of("miss", new ArrayList<>(), "hit", new ArrayList<>(), "pair", new ArrayList<>()));
      }
      Map<String, GpuMemClient> admins = new LinkedHashMap<>();
      for (Map.Entry<String, DaemonProcess> d : daemons.entrySet()) {
        admins.put(d.getKey(), GpuMemClient.builder(d.getValue().unixTarget()).clientName("bench-admin").connect());
        cold.put(d.getKey(), Map.of("miss", new ArrayList<>(), "hit", new ArrayList<>()));
      }
      // Cold: each daemon's first round of first leases, its lease path warmed by pairs before.
      for (String mode : daemons.keySet()) {
        pushes(mode);
        pairs(daemons.get(mode).unixTarget(), new ArrayList<>());
        firstLeases(daemons.get(mode).unixTarget(), admins.get(mode), cold.get(mode).get("miss"),
            cold.get(mode).get("hit"));
      }
      // Warm-up: a first lease on a segment runs code that a lease on a mapped one does not (the
      // grant, the push, the client's mapping), once per segment and process; until it has run a
      // few hundred times it is interpreted, and timing it then times the JIT's thresholds.
      for (int round = 1; round < warmUpRounds; round++) {
        for (String mode : daemons.keySet()) {
          pushes(mode);
          firstLeases(daemons.get(mode).unixTarget(), admins.get(mode), new ArrayList<>(), new ArrayList<>());
        }
      }
      for (int round = 0; round < rounds; round++) {
        List<String> order = new ArrayList<>(daemons.keySet());
        if (round % 2 == 1) {
          java.util.Collections.reverse(order);
        }
        for (String mode : order) {
          pushes(mode);
          Map<String, List<Long>> s = samples.get(mode);
          PUSHED.set(0);
          firstLeases(daemons.get(mode).unixTarget(), admins.get(mode), s.get("miss"), s.get("hit"));
          pushedByMode.merge(mode, PUSHED.get(), Long::sum);
          pairs(daemons.get(mode).unixTarget(), s.get("pair"));
        }
      }
      admins.values().forEach(GpuMemClient::close);
    } finally {
      new java.util.HashSet<>(daemons.values()).forEach(DaemonProcess::close);
    }
    Map<String, Map<String, List<Long>>> fresh = freshDaemons();
    System.out.printf("%-38s %10s %10s %10s %8s %8s %10s %10s%n", "Java client, per lease call", "path p50", "fetch p50",
        "fd p50", "fetch/p", "fd/p", "path p90", "fd p90");
    for (String[] row : new String[][] {{"miss", "first lease, miss (new segment)"},
        {"hit", "first lease, hit (segment new here)"}, {"pair", "lease+release, mapped segment"}}) {
      printRow(row[1], samples, row[0]);
    }
    for (String[] row : new String[][] {{"miss", "cold: first lease, miss"}, {"hit", "cold: first lease, hit"}}) {
      printRow(row[1], cold, row[0]);
    }
    for (String[] row : new String[][] {{"miss", "new daemon: first lease, miss"}, {"hit", "new daemon: first lease, hit"}}) {
      printRow(row[1], fresh, row[0]);
    }
    System.out.println("(us; fd-fetch: by descriptor, each asked for; fd: pushed before the Lease reply; cold: each "
        + "daemon's first " + SEGMENTS + " of each, before the " + warmUpRounds + " warm-up rounds; fd-fetch's on the "
        + "fd daemon, after fd's; new daemon: the first " + SEGMENTS + " of a daemon started after the rounds, this "
        + "process's client code warm)");
    System.out.printf("(first leases that came pushed, of %d per mode: %s)%n", 2 * samples.get("fd").get("miss").size(),
        pushedByMode);
    System.out.printf("(%d rounds; %d first leases and %d pairs per mode)%n", rounds,
        samples.get("fd").get("miss").size(), samples.get("fd").get("pair").size());
  }

  /**
   * A new daemon per mode, started once this process's client code is warm, and its first round
   * of first leases (its lease path warmed by pairs before, as for "cold"): what is left of the
   * cold figures is the daemon's own first-time code.
   */
  private static Map<String, Map<String, List<Long>>> freshDaemons() {
    Map<String, Map<String, List<Long>>> fresh = new LinkedHashMap<>();
    for (String mode : List.of("path", "fd", "fd-fetch")) {
      fresh.put(mode, Map.of("miss", new ArrayList<>(), "hit", new ArrayList<>()));
      try (DaemonProcess daemon = DaemonProcess.start("--host-segments", mode.equals("path") ? "path" : "fd",
              "--host-devices", "1", "--host-device-bytes", "512MiB");
          GpuMemClient admin = GpuMemClient.builder(daemon.unixTarget()).clientName("bench-admin").connect()) {
        pushes(mode);
        pairs(daemon.unixTarget(), new ArrayList<>());
        firstLeases(daemon.unixTarget(), admin, fresh.get(mode).get("miss"), fresh.get(mode).get("hit"));
      }
    }
    return fresh;
  }

  /** One line of the table: {@code kind}'s p50 by mode and their ratios to by path, and p90. */
  private static void printRow(String label, Map<String, Map<String, List<Long>>> byMode, String kind) {
    long[] path = sorted(byMode.get("path").get(kind));
    long[] fetch = sorted(byMode.get("fd-fetch").get(kind));
    long[] fd = sorted(byMode.get("fd").get(kind));
    System.out.printf("%-38s %10.1f %10.1f %10.1f %8.2f %8.2f %10.1f %10.1f%n", label, q(path, 0.5), q(fetch, 0.5),
        q(fd, 0.5), q(fetch, 0.5) / q(path, 0.5), q(fd, 0.5) / q(path, 0.5), q(path, 0.9), q(fd, 0.9));
  }

  /**
   * A first client's leases (misses), then a second one's on the same segments (hits); then, with
   * both clients closed, the pool trimmed until it holds no segment, so that the next round's
   * first leases miss again. (By descriptor a segment stays pinned while this process has a
   * connection to the fd channel open, which is why the pair clients live only for their phase.)
   */
  private static void firstLeases(String target, GpuMemClient admin, List<Long> misses, List<Long> hits) {
    List<Lease> held = new ArrayList<>();
    try (GpuMemClient first = GpuMemClient.builder(target).clientName("bench-first").clientCacheBytes(0).connect()) {
      for (int i = 0; i < SEGMENTS; i++) {
        long started = System.nanoTime();
        held.add(first.lease(0, 2 * MIB));
        misses.add(System.nanoTime() - started);
      }
      PUSHED.addAndGet(first.fdChannel().pushed());
      if (held.stream().anyMatch(Lease::poolHit) || first.mapsOpened() != SEGMENTS) {
        throw new IllegalStateException("the first client should miss, each lease on a new segment");
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
      PUSHED.addAndGet(second.fdChannel().pushed());
      held.forEach(Lease::close);
    }
    emptyPool(admin);
  }

  /** Trims until the pool holds no segment (the clients' unmaps and ends arrive asynchronously). */
  private static void emptyPool(GpuMemClient admin) {
    AdminGrpc.AdminBlockingStub stub = AdminGrpc.newBlockingStub(admin.connection().channel());
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (true) {
      stub.trim(TrimRequest.newBuilder().setDevice(0).setKeepBytes(0).build());
      DeviceStats stats = stub.getStats(GetStatsRequest.newBuilder().setDevice(0).build()).getDevices(0);
      if (stats.getSegments() == 0) {
        return;
      }
      if (System.nanoTime() > deadline) {
        throw new IllegalStateException("the pool still holds segments after trims: " + stats);
      }
      sleepMillis(5);
    }
  }

  /** A new client's {@value #PAIRS} lease+release pairs on one segment, mapped by a first lease not timed. */
  private static void pairs(String target, List<Long> times) {
    try (GpuMemClient client = GpuMemClient.builder(target).clientName("bench-pairs").clientCacheBytes(0).connect()) {
      client.lease(0, MIB).close();
      for (int i = 0; i < PAIRS; i++) {
        long started = System.nanoTime();
        client.lease(0, MIB).close();
        times.add(System.nanoTime() - started);
      }
    }
  }

  /** Clients built from now on bind their sessions for pushed descriptors, unless {@code mode} is fd-fetch. */
  private static void pushes(String mode) {
    System.setProperty(FdChannelClient.PUSH_PROPERTY, Boolean.toString(!mode.equals("fd-fetch")));
  }

  private static void sleepMillis(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted", e);
    }
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
