package io.gpumemd.ctl;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;

/**
 * {@code gpumemctl loadgen}: drives a live daemon and reports latency percentiles (p50, p90,
 * p99, p99.9) and throughput per scenario, plus the ratios the design's targets are stated in.
 *
 * <p>Scenarios, in the order they run:
 * <ol>
 *   <li>{@code floor}: sequential gRPC health checks on the client's channel: the cost of one
 *       round trip through gRPC, the floor under every other figure;
 *   <li>{@code pairs}: sequential lease + release pairs per size (pool hits after warm-up);
 *   <li>{@code threads}: pairs from many blocking threads sharing one client;
 *   <li>{@code async}: a fixed number of asynchronous pairs always outstanding;
 *   <li>{@code procs}: several client processes with several threads each ({@link ChildProcesses});
 *   <li>{@code baseline}: a fresh /dev/shm buffer per use without the daemon ({@link ShmBaseline});
 *   <li>{@code hit}: the daemon's hit path as a worker sees it: the segment is already mapped and
 *       its pages resident, so a pair plus touching one byte is all it costs.
 * </ol>
 *
 * <p>Percentiles come from HdrHistogram rather than a sorted array of samples: recording is
 * constant time and allocation-free at any rate, per-thread histograms merge exactly, and a
 * child process ships its whole distribution to the parent in a few KiB.
 *
 * <p>Runs on the calling thread (plus its load threads); one instance per run.
 */
public final class LoadGen {
  static final List<String> SCENARIOS = List.of("floor", "pairs", "threads", "async", "procs", "baseline", "hit");
  private static final String TAG = "loadgen";

  static final String USAGE = """
      Usage: gpumemctl [--target T] loadgen [flags]

      Measures a live daemon: latency percentiles and throughput per scenario, and the ratios
      the design's targets are stated in. Progress goes to stderr; the report to stdout.

        --scenarios LIST       comma-separated, in any order; default all:
                               floor,pairs,threads,async,procs,baseline,hit
        --seconds S            measured time per case (default 5; fractions allowed)
        --warmup-seconds S     warm-up per case, not measured (default 2)
        --jit-warmup-seconds S before the first case, exercise every call the run makes so
                               that neither JVM compiles during a measured window (default 10)
        --proc-warmup-seconds S  warm-up of the 'procs' children: fresh JVMs, several
                               compiling at once on few cores, need long (default 20)
        --device N             device to lease on (default 0)
        --pair-sizes LIST      sizes for 'pairs' (default 4KiB,2MiB,64MiB)
        --size SIZE            lease size for threads, async, procs (default 4KiB)
        --threads N            blocking threads for 'threads' (default 16)
        --in-flight N          outstanding async pairs for 'async' (default 64)
        --procs N              client processes for 'procs' (default 4)
        --proc-threads N       threads per process for 'procs' (default 4)
        --hit-sizes LIST       sizes for 'baseline' and 'hit' (default 4KiB,2MiB,16MiB,64MiB)
        --baseline-dir DIR     where 'baseline' creates its files (default /dev/shm)
        --json                 print the report as JSON instead of a table
        --json-out FILE        also write the JSON report to FILE
      """;

  private final String target;
  private final List<String> scenarios;
  private final LoadDriver.Timing timing;
  private final double seconds;
  private final double warmupSeconds;
  private final double jitWarmupSeconds;
  private final double procWarmupSeconds;
  private final int device;
  private final List<Long> pairSizes;
  private final long size;
  private final int threads;
  private final int inFlight;
  private final int procs;
  private final int procThreads;
  private final List<Long> hitSizes;
  private final Path baselineDir;
  private final boolean json;
  private final Path jsonOut;
  private final boolean child;
  private final PrintStream out;
  private final PrintStream err;

  private LoadGen(CommandLine cli, String target, PrintStream out, PrintStream err) {
    cli.allow(GpuMemCtl.GLOBAL_FLAGS, "scenarios", "seconds", "warmup-seconds", "jit-warmup-seconds",
        "proc-warmup-seconds", "device", "pair-sizes", "size",
        "threads", "in-flight", "procs", "proc-threads", "hit-sizes", "baseline-dir", "json-out", "child");
    this.target = target;
    this.scenarios = parseScenarios(cli.string("scenarios", String.join(",", SCENARIOS)));
    this.seconds = cli.seconds("seconds", 5, 0.001, 86_400);
    this.warmupSeconds = cli.seconds("warmup-seconds", 2, 0, 86_400);
    this.timing = LoadDriver.Timing.ofSeconds(warmupSeconds, seconds);
    this.jitWarmupSeconds = cli.seconds("jit-warmup-seconds", 10, 0, 86_400);
    this.procWarmupSeconds = cli.seconds("proc-warmup-seconds", 20, 0, 86_400);
    this.device = cli.integer("device", 0, 0, Integer.MAX_VALUE);
    this.pairSizes = cli.sizes("pair-sizes", List.of(4L << 10, 2L << 20, 64L << 20));
    this.size = cli.size("size", 4L << 10);
    if (size <= 0) {
      throw UsageException.of("--size", Long.toString(size), "a size above 0");
    }
    this.threads = cli.integer("threads", 16, 1, 4096);
    this.inFlight = cli.integer("in-flight", 64, 1, 65_536);
    this.procs = cli.integer("procs", 4, 1, 256);
    this.procThreads = cli.integer("proc-threads", 4, 1, 4096);
    this.hitSizes = cli.sizes("hit-sizes", List.of(4L << 10, 2L << 20, 16L << 20, 64L << 20));
    for (long hitSize : hitSizes) {
      if (hitSize > Integer.MAX_VALUE) {
        throw UsageException.of("--hit-sizes", Sizes.label(hitSize), "sizes below 2 GiB (one mapped buffer)");
      }
    }
    this.baselineDir = Path.of(cli.string("baseline-dir", "/dev/shm"));
    this.json = cli.has("json");
    this.jsonOut = cli.has("json-out") ? Path.of(cli.string("json-out", "")) : null;
    this.child = cli.has("child");
    this.out = out;
    this.err = err;
  }

  static LoadGen fromCommandLine(CommandLine cli, String target, PrintStream out, PrintStream err) {
    return new LoadGen(cli, target, out, err);
  }

  private static List<String> parseScenarios(String text) {
    List<String> wanted = new ArrayList<>();
    for (String part : text.split(",")) {
      String name = part.trim();
      if (!SCENARIOS.contains(name)) {
        throw UsageException.of("--scenarios", "'" + name + "'", "a comma-separated list of " + String.join(", ", SCENARIOS));
      }
      wanted.add(name);
    }
    return SCENARIOS.stream().filter(wanted::contains).toList();
  }

  private Map<String, Object> settings() {
    Map<String, Object> s = new LinkedHashMap<>();
    s.put("scenarios", scenarios);
    s.put("seconds", seconds);
    s.put("warmupSeconds", warmupSeconds);
    s.put("jitWarmupSeconds", jitWarmupSeconds);
    s.put("procWarmupSeconds", procWarmupSeconds);
    s.put("device", device);
    s.put("pairSizes", pairSizes.stream().map(Sizes::label).toList());
    s.put("sizeBytes", size);
    s.put("threads", threads);
    s.put("inFlight", inFlight);
    s.put("procs", procs);
    s.put("procThreads", procThreads);
    s.put("hitSizes", hitSizes.stream().map(Sizes::label).toList());
    s.put("baselineDir", baselineDir.toString());
    return s;
  }

  /** @return 0, or 1 when a case saw errors */
  int run() {
    if (child) {
      return runChild();
    }
    List<LoadResult> results = new ArrayList<>();
    try (GpuMemClient client = GpuMemCtl.connect(target, "gpumemctl-loadgen")) {
      warmUpJit(client);
      for (String scenario : scenarios) {
        switch (scenario) {
          case "floor" -> results.add(measure(() -> floor(client)));
          case "pairs" -> {
            for (long pairSize : pairSizes) {
              results.add(measure(() -> pairs(client, pairSize)));
            }
          }
          case "threads" -> results.add(measure(() -> threads(client)));
          case "async" -> results.add(measure(() -> async(client)));
          case "procs" -> results.add(measure(() -> ChildProcesses.run(target, procs, procThreads, size, device,
              LoadDriver.Timing.ofSeconds(procWarmupSeconds, seconds), err)));
          case "baseline" -> {
            ShmBaseline shm = new ShmBaseline(baselineDir);
            for (long hitSize : hitSizes) {
              results.add(measure(() -> baseline(shm, hitSize)));
            }
          }
          case "hit" -> {
            for (long hitSize : hitSizes) {
              results.add(measure(() -> hit(client, hitSize)));
            }
          }
          default -> throw new IllegalStateException(scenario);
        }
      }
    }
    LoadReport report = new LoadReport(target, settings(), results);
    String reportJson = report.toJson();
    if (jsonOut != null) {
      try {
        Files.writeString(jsonOut, reportJson + "\n", StandardCharsets.UTF_8);
      } catch (IOException e) {
        err.println("gpumemctl: loadgen: cannot write --json-out " + jsonOut + ": " + e.getMessage());
        return 1;
      }
    }
    if (json) {
      out.println(reportJson);
    } else {
      report.printTable(out);
    }
    return report.errors() == 0 ? 0 : 1;
  }

  /**
   * Exercises every call the run will make (health, blocking and async pairs of every size)
   * until the JIT of both JVMs has compiled the hot paths: on a small machine C2 takes many
   * seconds, and a compile landing in a measured window shows up as latency.
   */
  private void warmUpJit(GpuMemClient client) {
    if (jitWarmupSeconds <= 0) {
      return;
    }
    err.printf("loadgen: JIT warm-up for %.1f s%n", jitWarmupSeconds);
    HealthGrpc.HealthBlockingStub health = HealthGrpc.newBlockingStub(client.connection().channel());
    List<Long> sizes = new ArrayList<>(pairSizes);
    sizes.add(size);
    sizes.addAll(hitSizes);
    long deadline = System.nanoTime() + (long) (jitWarmupSeconds * 1e9);
    while (System.nanoTime() < deadline) {
      for (int i = 0; i < 50; i++) {
        health.check(HealthCheckRequest.getDefaultInstance());
      }
      for (long warmSize : sizes) {
        for (int i = 0; i < 10; i++) {
          try (Lease lease = client.lease(device, warmSize, false, TAG)) {
            lease.buffer().put(0, (byte) 1);
          }
        }
      }
      List<CompletableFuture<Void>> inFlightPairs = new ArrayList<>();
      for (int i = 0; i < 64; i++) {
        inFlightPairs.add(client.leaseAsync(device, size, false, TAG).thenCompose(Lease::closeAsync));
      }
      CompletableFuture.allOf(inFlightPairs.toArray(CompletableFuture[]::new)).join();
    }
  }

  private interface Case {
    LoadResult run() throws Exception;
  }

  private LoadResult measure(Case c) {
    LoadResult result;
    try {
      result = c.run();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted", e);
    } catch (Exception e) {
      throw new IllegalStateException("load case failed to start: " + e, e);
    }
    err.printf("loadgen: %-8s %-28s %9d ops  %10.0f ops/s  p50 %8.1f us  p99 %8.1f us%s%n", result.scenario,
        result.label, result.ops, result.opsPerSecond(), result.micros(50), result.micros(99),
        result.errors == 0 ? "" : "  ERRORS " + result.errors + ": " + result.firstError);
    return result;
  }

  private static Map<String, Object> sized(long sizeBytes) {
    Map<String, Object> details = new LinkedHashMap<>();
    details.put("sizeBytes", sizeBytes);
    return details;
  }

  private LoadResult floor(GpuMemClient client) {
    HealthGrpc.HealthBlockingStub health = HealthGrpc.newBlockingStub(client.connection().channel());
    HealthCheckRequest request = HealthCheckRequest.getDefaultInstance();
    return LoadDriver.sequential("floor", "health check", timing, false, Map.of(), () -> {
      HealthCheckResponse response = health.check(request);
      if (response.getStatus() != HealthCheckResponse.ServingStatus.SERVING) {
        throw new IllegalStateException("daemon health is " + response.getStatus());
      }
      return true;
    });
  }

  private LoadDriver.Op pair(GpuMemClient client, long sizeBytes) {
    return () -> {
      try (Lease lease = client.lease(device, sizeBytes, false, TAG)) {
        return lease.poolHit();
      }
    };
  }

  private LoadResult pairs(GpuMemClient client, long sizeBytes) {
    return LoadDriver.sequential("pairs", Sizes.label(sizeBytes), timing, true, sized(sizeBytes), pair(client, sizeBytes));
  }

  private LoadResult threads(GpuMemClient client) {
    Map<String, Object> details = sized(size);
    details.put("threads", threads);
    return LoadDriver.threaded("threads", threads + " threads x " + Sizes.label(size), threads, timing, true,
        details, pair(client, size), () -> { });
  }

  private LoadResult async(GpuMemClient client) throws InterruptedException {
    Map<String, Object> details = sized(size);
    details.put("inFlight", inFlight);
    return LoadDriver.async("async", inFlight + " in flight x " + Sizes.label(size), inFlight, timing, true, details,
        () -> client.leaseAsync(device, size, false, TAG)
            .thenCompose(lease -> lease.closeAsync().thenApply(done -> lease.poolHit())));
  }

  private LoadResult baseline(ShmBaseline shm, long sizeBytes) {
    return LoadDriver.sequential("baseline", Sizes.label(sizeBytes), timing, false, sized(sizeBytes), () -> {
      shm.oneBuffer(sizeBytes);
      return true;
    });
  }

  private LoadResult hit(GpuMemClient client, long sizeBytes) {
    // Map the segment and make its pages resident once, as a worker's first use would.
    try (Lease first = client.lease(device, sizeBytes, false, TAG)) {
      ByteBuffer memory = first.buffer();
      for (int i = 0; i < memory.capacity(); i += ShmBaseline.PAGE) {
        memory.put(i, (byte) 1);
      }
    }
    long mapsBefore = client.mapsOpened();
    LoadResult result = LoadDriver.sequential("hit", Sizes.label(sizeBytes), timing, true, sized(sizeBytes), () -> {
      try (Lease lease = client.lease(device, sizeBytes, false, TAG)) {
        lease.buffer().put(0, (byte) 1);
        return lease.poolHit();
      }
    });
    // Evidence that the case measured the hit path: no segment had to be mapped meanwhile.
    result.details.put("mappingsOpened", client.mapsOpened() - mapsBefore);
    return result;
  }

  /** A {@code procs} child: threads doing pairs, gated by the parent; prints its result as JSON. */
  private int runChild() {
    try (GpuMemClient client = GpuMemCtl.connect(target, "gpumemctl-loadgen-child")) {
      LoadResult result = LoadDriver.threaded("procs", "child", threads, timing, true, Map.of(), pair(client, size),
          ChildProcesses.childGate(out));
      out.println(ChildProcesses.childResult(result));
      out.flush();
      return result.errors == 0 ? 0 : 1;
    }
  }
}
