package io.gpumemd.it.bench;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * How long a worker waits while its daemon is taken over ({@code gpumemd --take-over}): a Java
 * client leases and closes 64 KiB blocks in a loop (the client cache tier off, so every lease is a
 * round trip to the daemon; over the session's stream, or with "unary" the unary Lease and Release
 * calls, which a daemon handing over holds and answers "moving") on one thread, holding {@value #DEFAULT_LIVE_LEASES} leases of 1 MiB
 * besides (or as many as asked, 4 KiB each beyond the first 64), while the daemon is taken over
 * {@value #DEFAULT_TAKE_OVERS} times in a row, each successor a JVM of its own. Per take-over it
 * records the longest single lease call from the moment the successor is launched until 1 s
 * after it is ready, and prints each, then their p50 and max, and the leases made meanwhile (none
 * may fail).
 *
 * <p>Where the time goes: each take-over's line also gives, in milliseconds from the moment the
 * old daemon closed its gate, the steps both daemons log (the old one's {@code state sent}, the
 * successor's {@code state received}, the old one's {@code Taken}, the successor serving on the
 * socket path, the old one stopped; the successor says what it restored once it serves, outside
 * the pause), and when the longest wait began and ended;
 * the last line gives their medians. Apart from the longest wait of the whole window it gives the
 * longest lease call that overlapped the hand-over itself (from the old daemon's gate closing to
 * its stop): on a loaded machine the successor's own start (its JVM, its rehearsal) can stall the
 * worker for longer than the hand-over, seconds before or after it.
 * Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" io.gpumemd.it.bench.TakeOverPauseMain [take-overs [live-leases [stream|unary]]]
 * </pre>
 */
public final class TakeOverPauseMain {
  private static final int DEFAULT_TAKE_OVERS = 20;
  private static final int DEFAULT_LIVE_LEASES = 64;
  /** Leases of 1 MiB held; the rest of the live leases are 4 KiB (10,000 of 1 MiB would not fit). */
  private static final int LARGE_LEASES = 64;

  /** The log lines of a take-over, in order, and which daemon logs each (true: the old one). */
  private static final String[][] STEPS = {
      {"sent", "old", "State sent to pid"},
      {"received", "new", "--take-over: state of pid"},
      {"taken", "old", "Handed over to pid"},
      {"serving", "new", "Took over from pid"},
      {"stopped", "old", "gpumemd handed over to pid"},
  };
  private static final String GATE_CLOSED = "no longer applying requests";

  private TakeOverPauseMain() {}

  public static void main(String[] args) throws Exception {
    System.setProperty(DaemonProcess.FULL_JIT, "true"); // time what a deployed daemon runs
    int takeOvers = args.length > 0 ? Integer.parseInt(args[0]) : DEFAULT_TAKE_OVERS;
    int liveLeases = args.length > 1 ? Integer.parseInt(args[1]) : DEFAULT_LIVE_LEASES;
    boolean unary = args.length > 2 && args[2].equals("unary");
    if (args.length > 2 && !unary && !args[2].equals("stream")) {
      throw new IllegalArgumentException("the third argument is stream (the default) or unary, not " + args[2]);
    }
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-takeover-bench-");
    String[] flags = {"--keepalive-grace-ms", "5000"};
    DaemonProcess daemon = DaemonProcess.startIn(dir, flags);
    Worker worker = null;
    long[] pauses = new long[takeOvers];
    long[] handOver = new long[takeOvers];
    long[] inHandOver = new long[takeOvers];
    long[] startup = new long[takeOvers];
    long[][] steps = new long[STEPS.length + 2][takeOvers];
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).unaryCalls(unary)
        .connect()) {
      List<Lease> held = hold(client, liveLeases);
      String session = client.sessionId();
      worker = new Worker(client);
      worker.start();
      Thread.sleep(2000); // warm up
      for (int i = 0; i < takeOvers; i++) {
        worker.reset();
        DaemonProcess next = DaemonProcess.startIn(dir, concat(flags, "--take-over"));
        if (daemon.awaitExit(30_000) != 0) {
          throw new IllegalStateException("the old daemon did not exit 0:\n" + daemon.output());
        }
        Thread.sleep(1000);
        pauses[i] = worker.longestNanos.get() / 1000;
        handOver[i] = handOverMillis(daemon.output());
        long[] at = breakdown(daemon.output(), next.output(), worker);
        for (int s = 0; s < at.length; s++) {
          steps[s][i] = at[s];
        }
        // From the gate closing to the old daemon's stop ("stopped", the last of STEPS).
        inHandOver[i] = worker.longestWithin(logged(daemon.output(), GATE_CLOSED),
            logged(daemon.output(), STEPS[STEPS.length - 1][2]));
        // What a rehearsal costs: the successor's start, while the old daemon serves on.
        startup[i] = logged(next.output(), "gpumemd ready") - logged(next.output(), "gpumemd starting");
        System.out.printf("take-over %2d: longest lease wait %,8d us (%,8d us overlapping the hand-over); hand-over %d "
            + "ms (gate closed to Taken); successor started to ready %,d ms; %s%n", i + 1, pauses[i], inHandOver[i],
            handOver[i], startup[i], describe(at));
        daemon.close();
        daemon = next;
      }
      worker.stop();
      if (!session.equals(client.sessionId())) {
        throw new IllegalStateException("the session changed: " + session + " -> " + client.sessionId());
      }
      held.forEach(Lease::close);
    } finally {
      if (worker != null) {
        worker.stop();
      }
      daemon.close();
      try (var walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
    long[] medians = new long[steps.length];
    for (int s = 0; s < steps.length; s++) {
      medians[s] = p50(steps[s]);
    }
    System.out.printf("%d take-overs with %,d live leases, %s calls, %,d leases, %d failed: longest lease wait p50 %,d us, "
        + "max %,d us; overlapping the hand-over p50 %,d us, max %,d us; hand-over p50 %d ms, max %d ms; successor "
        + "started to ready p50 %,d ms%nmedian steps: %s%n", takeOvers, liveLeases, unary ? "unary" : "stream",
        worker.leases.get(),
        worker.failures.size(), p50(pauses), max(pauses), p50(inHandOver), max(inHandOver), p50(handOver),
        max(handOver), p50(startup), describe(medians));
    if (!worker.failures.isEmpty()) {
      System.out.println("failures: " + worker.failures.subList(0, Math.min(10, worker.failures.size())));
      System.exit(1);
    }
  }

  /** Leases {@code count} blocks and keeps them: the first {@value #LARGE_LEASES} of 1 MiB, the rest of 4 KiB. */
  private static List<Lease> hold(GpuMemClient client, int count) {
    List<Lease> held = new ArrayList<>(count);
    for (int from = 0; from < count; from += 256) {
      List<CompletableFuture<Lease>> batch = new ArrayList<>();
      for (int i = from; i < Math.min(count, from + 256); i++) {
        batch.add(client.leaseAsync(i % 2, i < LARGE_LEASES ? 1 << 20 : 4 << 10, false, ""));
      }
      batch.forEach(f -> held.add(f.join()));
    }
    return held;
  }

  /** One thread leasing and closing 64 KiB in a loop, recording the longest call and when it was. */
  private static final class Worker {
    private final GpuMemClient client;
    private final Thread thread;
    private final AtomicBoolean stop = new AtomicBoolean();
    final AtomicLong leases = new AtomicLong();
    final AtomicLong longestNanos = new AtomicLong();
    /** Wall-clock milliseconds when the longest call began (written by the worker only). */
    volatile long longestBeganMillis;
    /** Calls of {@value #SLOW_MICROS} us or more since the last reset: {began millis, took us}. */
    private final List<long[]> slow = new ArrayList<>();
    private static final long SLOW_MICROS = 1000;
    final List<String> failures = new ArrayList<>();

    Worker(GpuMemClient client) {
      this.client = client;
      this.thread = new Thread(this::run, "lease-loop");
      thread.setDaemon(true);
    }

    void start() {
      thread.start();
    }

    void reset() {
      longestNanos.set(0);
      synchronized (slow) {
        slow.clear();
      }
    }

    /** The longest call (us) since the last reset that ran at some moment from {@code from} to {@code to} (ms). */
    long longestWithin(long from, long to) {
      long longest = 0;
      synchronized (slow) {
        for (long[] call : slow) {
          if (call[0] <= to && call[0] + call[1] / 1000 >= from) {
            longest = Math.max(longest, call[1]);
          }
        }
      }
      return longest;
    }

    private void run() {
      while (!stop.get()) {
        long began = System.currentTimeMillis();
        long t0 = System.nanoTime();
        try (Lease lease = client.lease(0, 64 << 10)) {
          lease.buffer().put(0, (byte) 1);
        } catch (RuntimeException e) {
          synchronized (failures) {
            failures.add(e.toString());
          }
        }
        long took = System.nanoTime() - t0;
        if (took >= SLOW_MICROS * 1000) {
          synchronized (slow) {
            slow.add(new long[] {began, took / 1000});
          }
        }
        if (took > longestNanos.get()) {
          longestNanos.set(took);
          longestBeganMillis = began;
        }
        leases.incrementAndGet();
      }
    }

    void stop() throws InterruptedException {
      stop.set(true);
      thread.join(10_000);
    }
  }

  /**
   * Milliseconds from the old daemon's gate closing to each of {@link #STEPS}, then to the begin
   * and the end of the longest wait; -1 for a line not found.
   */
  private static long[] breakdown(String old, String successor, Worker worker) {
    long[] at = new long[STEPS.length + 2];
    long gate = logged(old, GATE_CLOSED);
    for (int s = 0; s < STEPS.length; s++) {
      long t = logged(STEPS[s][1].equals("old") ? old : successor, STEPS[s][2]);
      at[s] = gate < 0 || t < 0 ? -1 : t - gate;
    }
    long began = worker.longestBeganMillis;
    at[STEPS.length] = gate < 0 ? -1 : began - gate;
    at[STEPS.length + 1] = gate < 0 ? -1 : began + worker.longestNanos.get() / 1_000_000 - gate;
    return at;
  }

  private static String describe(long[] at) {
    StringBuilder out = new StringBuilder("from gate closed, ms:");
    for (int s = 0; s < STEPS.length; s++) {
      out.append(' ').append(STEPS[s][0]).append(' ').append(at[s]);
    }
    return out.append("; longest wait ").append(at[STEPS.length]).append("..").append(at[STEPS.length + 1])
        .toString();
  }

  /** The wall-clock milliseconds of the first line containing {@code text}, or -1. */
  private static long logged(String output, String text) {
    for (String line : output.split("\n")) {
      if (line.contains(text)) {
        try {
          return OffsetDateTime.parse(line.substring(0, line.indexOf(' '))).toInstant().toEpochMilli();
        } catch (RuntimeException e) {
          return -1;
        }
      }
    }
    return -1;
  }

  /** The holder's "Handed over to pid N after M ms" figure. */
  private static long handOverMillis(String output) {
    Matcher m = Pattern.compile("Handed over to pid \\d+ after (\\d+) ms").matcher(output);
    return m.find() ? Long.parseLong(m.group(1)) : -1;
  }

  private static long p50(long[] values) {
    long[] sorted = values.clone();
    Arrays.sort(sorted);
    return sorted[sorted.length / 2];
  }

  private static long max(long[] values) {
    return Arrays.stream(values).max().orElse(-1);
  }

  private static String[] concat(String[] a, String b) {
    String[] out = Arrays.copyOf(a, a.length + 1);
    out[a.length] = b;
    return out;
  }
}
