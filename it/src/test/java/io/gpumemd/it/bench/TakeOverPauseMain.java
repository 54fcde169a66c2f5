package io.gpumemd.it.bench;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

/**
 * How long a worker waits while its daemon is taken over ({@code gpumemd --take-over}): a Java
 * client leases and closes 64 KiB blocks in a loop (the client cache tier off, so every lease is a
 * round trip to the daemon) on one thread, holding 64 leases of 1 MiB besides, while the daemon
 * is taken over {@value #DEFAULT_TAKE_OVERS} times in a row, each successor a JVM of its own. Per
 * take-over it records the longest single lease call from the moment the successor is launched
 * until 1 s after it is ready, and prints each, then their p50 and max, and the leases made
 * meanwhile (none may fail). Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.TakeOverPauseMain [take-overs]
 * </pre>
 */
public final class TakeOverPauseMain {
  private static final int DEFAULT_TAKE_OVERS = 20;

  private TakeOverPauseMain() {}

  public static void main(String[] args) throws Exception {
    int takeOvers = args.length > 0 ? Integer.parseInt(args[0]) : DEFAULT_TAKE_OVERS;
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-takeover-bench-");
    String[] flags = {"--keepalive-grace-ms", "5000"};
    DaemonProcess daemon = DaemonProcess.startIn(dir, flags);
    AtomicLong longest = new AtomicLong();
    AtomicLong leases = new AtomicLong();
    List<String> failures = new ArrayList<>();
    long[] pauses = new long[takeOvers];
    long[] stateMillis = new long[takeOvers];
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      List<Lease> held = new ArrayList<>();
      for (int i = 0; i < 64; i++) {
        held.add(client.lease(i % 2, 1 << 20));
      }
      String session = client.sessionId();
      java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
      Thread worker = new Thread(() -> {
        while (!stop.get()) {
          long t0 = System.nanoTime();
          try (Lease lease = client.lease(0, 64 << 10)) {
            lease.buffer().put(0, (byte) 1);
          } catch (RuntimeException e) {
            synchronized (failures) {
              failures.add(e.toString());
            }
          }
          longest.accumulateAndGet(System.nanoTime() - t0, Math::max);
          leases.incrementAndGet();
        }
      }, "lease-loop");
      worker.setDaemon(true);
      worker.start();
      Thread.sleep(2000); // warm up
      for (int i = 0; i < takeOvers; i++) {
        longest.set(0);
        DaemonProcess next = DaemonProcess.startIn(dir, concat(flags, "--take-over"));
        if (daemon.awaitExit(30_000) != 0) {
          throw new IllegalStateException("the old daemon did not exit 0:\n" + daemon.output());
        }
        Thread.sleep(1000);
        pauses[i] = longest.get() / 1000;
        stateMillis[i] = handOverMillis(daemon.output());
        System.out.printf("take-over %2d: longest lease wait %,8d us; hand-over %d ms (gate closed to Taken)%n", i + 1,
            pauses[i], stateMillis[i]);
        daemon.close();
        daemon = next;
      }
      stop.set(true);
      worker.join(10_000);
      if (!session.equals(client.sessionId())) {
        throw new IllegalStateException("the session changed: " + session + " -> " + client.sessionId());
      }
      held.forEach(Lease::close);
    } finally {
      daemon.close();
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
    long[] sorted = pauses.clone();
    Arrays.sort(sorted);
    long[] hand = stateMillis.clone();
    Arrays.sort(hand);
    System.out.printf("%d take-overs, %,d leases, %d failed: longest lease wait p50 %,d us, max %,d us; "
        + "hand-over p50 %d ms, max %d ms%n", takeOvers, leases.get(), failures.size(), sorted[sorted.length / 2],
        sorted[sorted.length - 1], hand[hand.length / 2], hand[hand.length - 1]);
    if (!failures.isEmpty()) {
      System.out.println("failures: " + failures.subList(0, Math.min(10, failures.size())));
      System.exit(1);
    }
  }

  /** The holder's "Handed over to pid N after M ms" figure. */
  private static long handOverMillis(String output) {
    java.util.regex.Matcher m = java.util.regex.Pattern.compile("Handed over to pid \\d+ after (\\d+) ms").matcher(output);
    return m.find() ? Long.parseLong(m.group(1)) : -1;
  }

  private static String[] concat(String[] a, String b) {
    String[] out = Arrays.copyOf(a, a.length + 1);
    out[a.length] = b;
    return out;
  }
}
