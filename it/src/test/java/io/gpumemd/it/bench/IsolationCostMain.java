package io.gpumemd.it.bench;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.server.testing.TestDaemon;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * What {@code --isolate session} costs against the default (sessions of one tenant share
 * segments): {@code SESSIONS} sessions each lease one small block, then release it and lease it
 * again (20 times). Prints, per mode, the device memory reserved, the segments, and the first and repeat
 * lease latency (median over the sessions), all measured in one run. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.IsolationCostMain 64 4096
 * </pre>
 */
public final class IsolationCostMain {
  private static final int REPEATS = 20;
  private IsolationCostMain() {}

  public static void main(String[] args) throws Exception {
    int sessions = args.length > 0 ? Integer.parseInt(args[0]) : 64;
    long size = args.length > 1 ? Long.parseLong(args[1]) : 4096;
    System.out.printf("%d sessions, one %d-byte lease each (host backend, one process)%n%n", sessions, size);
    System.out.printf("%-9s %12s %9s %18s %19s%n", "isolate", "reserved", "segments", "first lease p50", "repeat lease p50");
    for (int round = 0; round < 4; round++) { // three rounds warm the JVM up; the last is reported
      for (String mode : List.of("tenant", "session")) {
        run(mode, sessions, size, round == 3);
      }
    }
  }

  private static void run(String mode, int sessions, long size, boolean report) throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--isolate", mode, "--host-device-bytes", "1GiB")) {
      List<GpuMemClient> clients = new ArrayList<>();
      long[] first = new long[sessions];
      long[] repeat = new long[sessions * REPEATS];
      try {
        for (int i = 0; i < sessions; i++) {
          clients.add(GpuMemClient.builder(daemon.unixTarget()).clientName("s" + i).clientCacheBytes(0).connect());
        }
        for (int i = 0; i < sessions; i++) {
          long t0 = System.nanoTime();
          Lease lease = clients.get(i).lease(0, size);
          first[i] = System.nanoTime() - t0;
          lease.close();
        }
        for (int r = 0; r < REPEATS; r++) {
          for (int i = 0; i < sessions; i++) {
            long t0 = System.nanoTime();
            Lease lease = clients.get(i).lease(0, size);
            repeat[r * sessions + i] = System.nanoTime() - t0;
            lease.close();
          }
        }
        for (GpuMemClient c : clients) {
          c.lease(0, size); // held, so reserved bytes show what the sessions occupy
        }
        DeviceStats stats = AdminGrpc.newBlockingStub(clients.get(0).connection().channel())
            .getStats(GetStatsRequest.getDefaultInstance()).getDevices(0);
        if (report) {
          System.out.printf("%-9s %9.1f MiB %9d %15.1f µs %16.1f µs%n", mode, stats.getReservedBytes() / 1048576.0,
              stats.getSegments(), median(first) / 1e3, median(repeat) / 1e3);
        }
      } finally {
        clients.forEach(GpuMemClient::close);
      }
    }
  }

  private static double median(long[] values) {
    long[] sorted = values.clone();
    Arrays.sort(sorted);
    return sorted[sorted.length / 2];
  }
}
