package io.gpumemd.it.bench;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Published;
import io.gpumemd.client.Share;
import io.gpumemd.client.ShareOptions;
import io.gpumemd.server.testing.DaemonProcess;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.List;

/**
 * What handing a block to another process costs, sharing against copying, all in one run
 * against a daemon in its own JVM (host backend, Unix socket). A producer session holds a
 * block with data; a consumer session, per round, gets at the data and lets go:
 *
 * <ul>
 *   <li>{@code lookup}: Lookup of the published block, read one word, close the hold (2 calls);
 *   <li>{@code share+attach}: the producer makes a one-shot token, the consumer attaches, reads
 *       one word, closes the hold (3 calls);
 *   <li>{@code lease+copy}: the consumer leases a block of its own and copies the producer's
 *       bytes into it, then releases it: what a hand-off costs without sharing.
 * </ul>
 *
 * Prints p50 and p90 per size. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.SharingCostMain
 * </pre>
 */
public final class SharingCostMain {
  private static final int ROUNDS = 300;
  private static final int WARMUP = 100;

  private SharingCostMain() {}

  public static void main(String[] args) throws Exception {
    System.setProperty(DaemonProcess.FULL_JIT, "true"); // time what a deployed daemon runs
    DaemonProcess daemon = DaemonProcess.start("--host-device-bytes", "2GiB");
    try (GpuMemClient producer = GpuMemClient.builder(daemon.unixTarget()).clientName("producer").connect();
         GpuMemClient consumer = GpuMemClient.builder(daemon.unixTarget()).clientName("consumer").connect()) {
      System.out.printf("hand-off of one block to another session, %d rounds per case after %d warm-up rounds%n%n",
          ROUNDS, WARMUP);
      System.out.printf("%-10s %-14s %10s %10s%n", "size", "case", "p50 us", "p90 us");
      // The first pass warms both JVMs up on every path; the second is reported.
      for (int pass = 0; pass < 2; pass++) {
        runPass(producer, consumer, pass == 1);
      }
    } finally {
      daemon.close();
    }
  }

  private static void runPass(GpuMemClient producer, GpuMemClient consumer, boolean report) {
    for (long size : List.of(4L << 10, 2L << 20, 64L << 20, 256L << 20)) {
      try (Lease data = producer.lease(0, size, true, "data");
           Published name = producer.publish(data, "bench/" + size)) {
        data.buffer().putLong(0, size);
        print(report, size, "lookup", time(() -> {
          try (Lease hold = consumer.lookup("bench/" + size)) {
            check(hold.buffer().getLong(0), size);
          }
        }));
        print(report, size, "share+attach", time(() -> {
          Share share = data.share(ShareOptions.oneShot());
          try (Lease hold = consumer.attach(share.token())) {
            check(hold.buffer().getLong(0), size);
          }
        }));
        ByteBuffer source = data.buffer();
        print(report, size, "lease+copy", time(() -> {
          try (Lease copy = consumer.lease(0, size)) {
            copy.buffer().put(0, source, 0, (int) Math.min(size, Integer.MAX_VALUE));
            check(copy.buffer().getLong(0), size);
          }
        }));
      }
    }
  }

  private static void check(long got, long expected) {
    if (got != expected) {
      throw new AssertionError("read " + got + ", expected " + expected);
    }
  }

  private static long[] time(Runnable round) {
    long[] nanos = new long[ROUNDS];
    for (int i = 0; i < WARMUP + ROUNDS; i++) {
      long t0 = System.nanoTime();
      round.run();
      if (i >= WARMUP) {
        nanos[i - WARMUP] = System.nanoTime() - t0;
      }
    }
    Arrays.sort(nanos);
    return nanos;
  }

  private static void print(boolean report, long size, String name, long[] sorted) {
    if (!report) {
      return;
    }
    System.out.printf("%-10s %-14s %10.1f %10.1f%n", io.gpumemd.common.Sizes.format(size), name,
        sorted[sorted.length / 2] / 1e3, sorted[sorted.length * 9 / 10] / 1e3);
  }
}
