package io.gpumemd.ctl;

import io.gpumemd.client.ClientStats;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.common.Sizes;
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
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import picocli.CommandLine.Command;
import picocli.CommandLine.ITypeConverter;
import picocli.CommandLine.Option;
import picocli.CommandLine.TypeConversionException;

/**
 * {@code gpumemctl loadgen}: drives a live daemon and reports latency percentiles (p50, p90,
 * p99, p99.9) and throughput per scenario, plus the ratios the README's performance targets
 * are stated in.
 *
 * <p>Scenarios, in the order they run. Three clients take part: the default one (session
 * stream and client cache tier), a stream-only one (client cache off: every lease is served by
 * the daemon, one round trip) and a unary one (Lease and Release calls, two round trips a pair,
 * as before the stream existed), so that the paths are compared in one run:
 * <ol>
 *   <li>{@code floor}: sequential gRPC health checks on the client's channel: the cost of one
 *       round trip through gRPC, the floor under every other figure;
 *   <li>{@code local}: lease + close per size served from the client's own cache (no round trip);
 *   <li>{@code stream}: lease + close per size, daemon-served over the session stream;
 *   <li>{@code close}: the close() of a daemon-served lease alone (a notice, never waited for);
 *   <li>{@code pairs}: sequential unary lease + release pairs per size (pool hits after warm-up);
 *   <li>{@code stream-async}: a fixed number of daemon-served leases always outstanding, stream;
 *   <li>{@code async}: the same number of asynchronous unary pairs always outstanding;
 *   <li>{@code threads}: unary pairs from many blocking threads sharing one client;
 *   <li>{@code procs}: several client processes (default client) with several threads each
 *       ({@link ChildProcesses});
 *   <li>{@code pressure}: a second process keeps memory in its client cache that this one needs
 *       ({@link Pressure}); the lease waits for the daemon to get it back;
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
@Command(name = "loadgen",
    description = {"latency and throughput report of a live daemon",
        "Measures latency percentiles and throughput per scenario, and the ratios the performance "
            + "targets are stated in. Progress goes to stderr; the report to stdout."})
final class LoadGen implements Callable<Integer>, GpuMemCtl.Validated {
  static final List<String> SCENARIOS = List.of("floor", "local", "stream", "close", "pairs", "stream-async", "async",
      "threads", "procs", "pressure", "baseline", "hit");
  private static final String TAG = "loadgen";

  private final GpuMemCtl ctl;

  @Option(names = "--scenarios", paramLabel = "NAME", split = ",", converter = ScenarioName.class,
      defaultValue = "floor,local,stream,close,pairs,stream-async,async,threads,procs,pressure,baseline,hit",
      description = "comma-separated, in any order (default: all: ${DEFAULT-VALUE})")
  private List<String> scenarios;

  @Option(names = "--seconds", paramLabel = "S", defaultValue = "5",
      description = "measured time per case; fractions allowed (default: ${DEFAULT-VALUE})")
  private double seconds;

  @Option(names = "--warmup-seconds", paramLabel = "S", defaultValue = "2",
      description = "warm-up per case, not measured (default: ${DEFAULT-VALUE})")
  private double warmupSeconds;

  @Option(names = "--jit-warmup-seconds", paramLabel = "S", defaultValue = "10",
      description = "before the first case, exercise every call the run makes so that neither JVM "
          + "compiles during a measured window (default: ${DEFAULT-VALUE})")
  private double jitWarmupSeconds;

  @Option(names = "--proc-warmup-seconds", paramLabel = "S", defaultValue = "20",
      description = "warm-up of the 'procs' children: fresh JVMs, several compiling at once on few "
          + "cores, need long (default: ${DEFAULT-VALUE})")
  private double procWarmupSeconds;

  @Option(names = "--device", paramLabel = "N", description = "device to lease on (default: ${DEFAULT-VALUE})")
  private int device;

  @Option(names = "--pair-sizes", paramLabel = "SIZE", split = ",", converter = Converters.Size.class,
      defaultValue = "4KiB,2MiB,64MiB", description = "sizes for 'local', 'stream', 'pairs' (default: ${DEFAULT-VALUE})")
  private List<Long> pairSizes;

  @Option(names = "--size", paramLabel = "SIZE", converter = Converters.Size.class, defaultValue = "4KiB",
      description = "lease size for close, stream-async, async, threads, procs (default: ${DEFAULT-VALUE})")
  private long size;

  @Option(names = "--threads", paramLabel = "N", defaultValue = "16",
      description = "blocking threads for 'threads' (default: ${DEFAULT-VALUE})")
  private int threads;

  @Option(names = "--in-flight", paramLabel = "N", defaultValue = "64",
      description = "outstanding async pairs for 'async' (default: ${DEFAULT-VALUE})")
  private int inFlight;

  @Option(names = "--procs", paramLabel = "N", defaultValue = "8",
      description = "client processes for 'procs' (default: ${DEFAULT-VALUE})")
  private int procs;

  @Option(names = "--proc-threads", paramLabel = "N", defaultValue = "4",
      description = "threads per process for 'procs' (default: ${DEFAULT-VALUE})")
  private int procThreads;

  @Option(names = "--hit-sizes", paramLabel = "SIZE", split = ",", converter = Converters.Size.class,
      defaultValue = "4KiB,2MiB,16MiB,64MiB", description = "sizes for 'baseline' and 'hit' (default: ${DEFAULT-VALUE})")
  private List<Long> hitSizes;

  @Option(names = "--baseline-dir", paramLabel = "DIR", defaultValue = "/dev/shm",
      description = "where 'baseline' creates its files (default: ${DEFAULT-VALUE})")
  private Path baselineDir;

  @Option(names = "--json-out", paramLabel = "FILE", description = "also write the JSON report to FILE")
  private Path jsonOut;

  /** A {@code procs} child process ({@link ChildProcesses}); not for people. */
  @Option(names = "--child", hidden = true)
  private boolean child;

  /** The {@code pressure} scenario's hoarding child ({@link Pressure}); not for people. */
  @Option(names = "--hoarder", hidden = true)
  private boolean hoarder;

  @Option(names = "--pressure-rounds", paramLabel = "N", defaultValue = "20",
      description = "rounds of the 'pressure' scenario (default: ${DEFAULT-VALUE})")
  private int pressureRounds;

  private LoadDriver.Timing timing;
  private boolean json;
  private PrintStream out;
  private PrintStream err;

  LoadGen(GpuMemCtl ctl) {
    this.ctl = ctl;
  }

  /** A scenario's name, checked against {@link #SCENARIOS}. */
  static final class ScenarioName implements ITypeConverter<String> {
    @Override
    public String convert(String value) {
      String name = value.trim();
      if (!SCENARIOS.contains(name)) {
        throw new TypeConversionException("a comma-separated list of " + String.join(", ", SCENARIOS));
      }
      return name;
    }
  }

  @Override
  public void validate(GpuMemCtl.Problems problems) {
    checkRange(problems, "--seconds", seconds, 0.001, 86_400);
    checkRange(problems, "--warmup-seconds", warmupSeconds, 0, 86_400);
    checkRange(problems, "--jit-warmup-seconds", jitWarmupSeconds, 0, 86_400);
    checkRange(problems, "--proc-warmup-seconds", procWarmupSeconds, 0, 86_400);
    checkRange(problems, "--device", device, 0, Integer.MAX_VALUE);
    checkRange(problems, "--threads", threads, 1, 4096);
    checkRange(problems, "--in-flight", inFlight, 1, 65_536);
    checkRange(problems, "--procs", procs, 1, 256);
    checkRange(problems, "--pressure-rounds", pressureRounds, 1, 10_000);
    checkRange(problems, "--proc-threads", procThreads, 1, 4096);
    if (size <= 0) {
      problems.add("--size", Sizes.label(size), "a size above 0");
    }
    for (long pairSize : pairSizes == null ? List.<Long>of() : pairSizes) {
      if (pairSize <= 0) {
        problems.add("--pair-sizes", Sizes.label(pairSize), "sizes above 0");
      }
    }
    for (long hitSize : hitSizes == null ? List.<Long>of() : hitSizes) {
      if (hitSize <= 0 || hitSize > Integer.MAX_VALUE) {
        problems.add("--hit-sizes", Sizes.label(hitSize), "sizes in [1, 2 GiB) (one mapped buffer)");
      }
    }
  }

  private static void checkRange(GpuMemCtl.Problems problems, String name, double value, double min, double max) {
    if (!(value >= min && value <= max)) {
      boolean integral = value == Math.rint(value) && min == Math.rint(min) && max == Math.rint(max);
      problems.add(name, integral ? Long.toString((long) value) : Double.toString(value),
          integral ? "an integer in [" + (long) min + ", " + (long) max + "]" : "seconds in [" + min + ", " + max + "]");
    }
  }

  @Override
  public Integer call() {
    // in the order of SCENARIOS, whatever the order given, each once
    scenarios = SCENARIOS.stream().filter(scenarios::contains).toList();
    timing = LoadDriver.Timing.ofSeconds(warmupSeconds, seconds);
    json = ctl.json();
    out = ctl.out();
    err = ctl.err();
    return run();
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
  private int run() {
    if (child) {
      return runChild();
    }
    if (hoarder) {
      return Pressure.runHoarder(ctl, device, System.in, out);
    }
    List<LoadResult> results = new ArrayList<>();
    try (GpuMemClient client = ctl.connect("gpumemctl-loadgen");
         GpuMemClient stream = ctl.connect("gpumemctl-loadgen-stream", b -> b.clientCacheBytes(0));
         GpuMemClient unary = ctl.connect("gpumemctl-loadgen-unary", b -> b.unaryCalls(true))) {
      warmUpJit(client);
      warmUpJit(stream);
      warmUpJit(unary);
      for (String scenario : scenarios) {
        switch (scenario) {
          case "floor" -> results.add(measure(() -> floor(client)));
          case "local" -> {
            for (long pairSize : pairSizes == null ? List.<Long>of() : pairSizes) {
              results.add(measure(() -> local(client, pairSize)));
            }
          }
          case "stream" -> {
            for (long pairSize : pairSizes == null ? List.<Long>of() : pairSizes) {
              results.add(measure(() -> LoadDriver.sequential("stream", Sizes.label(pairSize), timing, true,
                  sized(pairSize), pair(stream, pairSize))));
            }
          }
          case "close" -> results.add(measure(() -> closeOnly(stream)));
          case "pairs" -> {
            for (long pairSize : pairSizes == null ? List.<Long>of() : pairSizes) {
              results.add(measure(() -> pairs(unary, pairSize)));
            }
          }
          case "stream-async" -> results.add(measure(() -> async("stream-async", stream)));
          case "async" -> results.add(measure(() -> async("async", unary)));
          case "threads" -> results.add(measure(() -> threads(unary)));
          case "pressure" -> results.add(measure(() -> Pressure.run(ctl, device, pressureRounds, stream, err)));
          case "procs" -> results.add(measure(() -> ChildProcesses.run(ctl.connectionFlags(), procs, procThreads, size, device,
              LoadDriver.Timing.ofSeconds(procWarmupSeconds, seconds), err)));
          case "baseline" -> {
            ShmBaseline shm = new ShmBaseline(baselineDir);
            for (long hitSize : hitSizes == null ? List.<Long>of() : hitSizes) {
              results.add(measure(() -> baseline(shm, hitSize)));
            }
          }
          case "hit" -> {
            for (long hitSize : hitSizes == null ? List.<Long>of() : hitSizes) {
              results.add(measure(() -> hit(unary, hitSize)));
            }
          }
          default -> throw new IllegalStateException(scenario);
        }
      }
    }
    LoadReport report = new LoadReport(ctl.target(), settings(), results);
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
            if (lease.isHost()) { // a CUDA lease has no buffer (issue 12: the warm-up died on one)
              lease.buffer().put(0, (byte) 1);
            }
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

  /** Lease + close from the client's own cache: after the first lease, every one is local. */
  private LoadResult local(GpuMemClient client, long sizeBytes) {
    ClientStats before = client.stats();
    LoadResult result = LoadDriver.sequential("local", Sizes.label(sizeBytes), timing, true, sized(sizeBytes),
        pair(client, sizeBytes));
    ClientStats after = client.stats();
    // Evidence that the case measured the local path: how many leases never left the process.
    result.details.put("localHits", after.localHits() - before.localHits());
    result.details.put("daemonLeases", after.daemonLeases() - before.daemonLeases());
    return result;
  }

  /** The close() of a daemon-served lease alone: the lease is made outside the timed part. */
  private LoadResult closeOnly(GpuMemClient client) {
    return LoadDriver.sequentialTimed("close", "close() x " + Sizes.label(size), timing, sized(size), () -> {
      Lease lease = client.lease(device, size, false, TAG);
      long t0 = System.nanoTime();
      lease.close();
      return System.nanoTime() - t0;
    });
  }

  private LoadResult async(String scenario, GpuMemClient client) throws InterruptedException {
    Map<String, Object> details = sized(size);
    details.put("inFlight", inFlight);
    return LoadDriver.async(scenario, inFlight + " in flight x " + Sizes.label(size), inFlight, timing, true, details,
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
    try (GpuMemClient client = ctl.connect("gpumemctl-loadgen-child")) {
      LoadResult result = LoadDriver.threaded("procs", "child", threads, timing, true, Map.of(), pair(client, size),
          ChildProcesses.childGate(out));
      out.println(ChildProcesses.childResult(result));
      out.flush();
      return result.errors == 0 ? 0 : 1;
    }
  }
}
