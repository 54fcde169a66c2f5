package io.gpumemd.ctl;

import java.io.PrintStream;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The load generator's report: the measured cases, the ratios that the performance targets are
 * stated in, and the machine they were measured on; printed as a table or as JSON. Immutable.
 */
final class LoadReport {
  /** A derived figure and, where the README's performance table sets one, its target. */
  record Ratio(String name, String label, double value, String comparison, Double target) {
    /** null where there is no target. */
    Boolean met() {
      if (target == null) {
        return null;
      }
      return comparison.equals("<=") ? value <= target : value >= target;
    }

    String verdict() {
      Boolean met = met();
      return met == null ? "-" : met ? "met" : "missed";
    }
  }

  static final double PAIR_P50_TARGET = 1.7;
  static final double PAIR_P99_TARGET = 3.0;
  static final double ASYNC_PAIRS_PER_SECOND_TARGET = 40_000;
  static final double HIT_SPEEDUP_TARGET = 20;
  static final long HIT_SPEEDUP_TARGET_SIZE = 16L << 20;
  // Issue 12's targets (2-core machine, host backend, Unix socket, separate processes).
  static final double LOCAL_P50_TARGET_US = 2;
  static final double LOCAL_P99_TARGET_US = 20;
  static final double STREAM_P50_TARGET = 1.15;
  static final double CLOSE_P50_TARGET_US = 5;
  static final double STREAM_ASYNC_SPEEDUP_TARGET = 1.5;
  static final double PRESSURE_SLACK_TARGET_US = 10_000;

  private final String target;
  private final Map<String, Object> settings;
  private final List<LoadResult> results;
  private final List<Ratio> ratios;

  LoadReport(String target, Map<String, Object> settings, List<LoadResult> results) {
    this.target = target;
    this.settings = new LinkedHashMap<>(settings);
    this.results = List.copyOf(results);
    this.ratios = computeRatios();
  }

  List<LoadResult> results() {
    return results;
  }

  List<Ratio> ratios() {
    return ratios;
  }

  long errors() {
    return results.stream().mapToLong(r -> r.errors).sum();
  }

  private LoadResult find(String scenario) {
    return results.stream().filter(r -> r.scenario.equals(scenario) && r.ops > 0).findFirst().orElse(null);
  }

  private List<Ratio> computeRatios() {
    List<Ratio> out = new ArrayList<>();
    LoadResult floor = find("floor");
    if (floor != null && floor.micros(50) > 0) {
      // The machine's own jitter: how far the tail of the simplest call lies from its median.
      out.add(new Ratio("health p99 / health p50", floor.label, floor.micros(99) / floor.micros(50), "", null));
      double twoFloors = 2 * floor.micros(50);
      for (LoadResult pair : results) {
        if (pair.scenario.equals("pairs") && pair.ops > 0) {
          out.add(new Ratio("pair p50 / (2 x health p50)", pair.label, pair.micros(50) / twoFloors, "<=", PAIR_P50_TARGET));
          out.add(new Ratio("pair p99 / (2 x health p50)", pair.label, pair.micros(99) / twoFloors, "<=", PAIR_P99_TARGET));
        }
      }
    }
    for (LoadResult local : results) {
      if (local.scenario.equals("local") && local.ops > 0) {
        out.add(new Ratio("local hit p50 (us)", local.label, local.micros(50), "<=", LOCAL_P50_TARGET_US));
        out.add(new Ratio("local hit p99 (us)", local.label, local.micros(99), "<=", LOCAL_P99_TARGET_US));
      }
    }
    if (floor != null && floor.micros(50) > 0) {
      for (LoadResult stream : results) {
        if (stream.scenario.equals("stream") && stream.ops > 0) {
          out.add(new Ratio("stream lease+close p50 / health p50", stream.label, stream.micros(50) / floor.micros(50),
              "<=", STREAM_P50_TARGET));
        }
      }
    }
    LoadResult close = find("close");
    if (close != null) {
      out.add(new Ratio("close() p50 (us)", close.label, close.micros(50), "<=", CLOSE_P50_TARGET_US));
    }
    LoadResult async = find("async");
    LoadResult streamAsync = find("stream-async");
    if (async != null && streamAsync != null && async.opsPerSecond() > 0) {
      out.add(new Ratio("stream-async pairs/s / unary async pairs/s", streamAsync.label,
          streamAsync.opsPerSecond() / async.opsPerSecond(), ">=", STREAM_ASYNC_SPEEDUP_TARGET));
    }
    LoadResult pressure = find("pressure");
    if (pressure != null && floor != null) {
      out.add(new Ratio("pressure lease max - health p50 (us)", pressure.label,
          pressure.maxMicros() - floor.micros(50), "<=", PRESSURE_SLACK_TARGET_US));
    }
    if (async != null) {
      out.add(new Ratio("async pairs/s", async.label, async.opsPerSecond(), ">=", ASYNC_PAIRS_PER_SECOND_TARGET));
      if (floor != null) {
        out.add(new Ratio("async pairs/s / health calls/s", async.label + " vs sequential health",
            async.opsPerSecond() / floor.opsPerSecond(), "", null));
      }
    }
    for (LoadResult baseline : results) {
      if (!baseline.scenario.equals("baseline") || baseline.ops == 0) {
        continue;
      }
      for (LoadResult hit : results) {
        if (hit.scenario.equals("hit") && hit.label.equals(baseline.label) && hit.ops > 0 && hit.micros(50) > 0) {
          boolean targeted = Long.valueOf(HIT_SPEEDUP_TARGET_SIZE).equals(hit.details.get("sizeBytes"));
          out.add(new Ratio("baseline p50 / hit p50", baseline.label, baseline.micros(50) / hit.micros(50),
              targeted ? ">=" : "", targeted ? HIT_SPEEDUP_TARGET : null));
        }
      }
    }
    return out;
  }

  static Map<String, Object> environment() {
    Map<String, Object> env = new LinkedHashMap<>();
    env.put("cpus", Runtime.getRuntime().availableProcessors());
    env.put("java", System.getProperty("java.vm.name") + " " + System.getProperty("java.runtime.version"));
    env.put("os", System.getProperty("os.name") + " " + System.getProperty("os.version") + " " + System.getProperty("os.arch"));
    return env;
  }

  String toJson() {
    Map<String, Object> json = new LinkedHashMap<>();
    json.put("tool", "gpumemctl loadgen");
    json.put("target", target);
    json.put("environment", environment());
    json.put("settings", settings);
    List<Object> cases = new ArrayList<>();
    results.forEach(r -> cases.add(r.toJson()));
    json.put("results", cases);
    List<Object> derived = new ArrayList<>();
    for (Ratio ratio : ratios) {
      Map<String, Object> r = new LinkedHashMap<>();
      r.put("name", ratio.name());
      r.put("case", ratio.label());
      r.put("value", ratio.value());
      if (ratio.target() != null) {
        r.put("target", ratio.comparison() + " " + fmt(ratio.target()));
        r.put("met", ratio.met());
      }
      derived.add(r);
    }
    json.put("ratios", derived);
    return JsonTree.print(json);
  }

  void printTable(PrintStream out) {
    Map<String, Object> env = environment();
    out.println("gpumemd load generator: " + target + ", " + env.get("cpus") + " CPUs, " + env.get("java") + ", "
        + env.get("os"));
    out.println("measured " + settings.get("seconds") + " s per case after " + settings.get("warmupSeconds")
        + " s warm-up; latency in microseconds per operation (a pair = lease + release)");
    out.println();
    Table table = new Table("SCENARIO", "CASE", ">OPS", ">OPS/S", ">P50", ">P90", ">P99", ">P99.9", ">MAX", ">HITS",
        "ERRORS");
    for (LoadResult r : results) {
      Double hits = r.hitPercent();
      table.row(r.scenario, r.label, r.ops, String.format(Locale.ROOT, "%,.0f", r.opsPerSecond()), us(r.micros(50)),
          us(r.micros(90)), us(r.micros(99)), us(r.micros(99.9)), us(r.maxMicros()),
          hits == null ? "-" : String.format(Locale.ROOT, "%.1f%%", hits),
          r.errors == 0 ? "0" : r.errors + ": " + r.firstError);
    }
    table.print(out);
    if (!ratios.isEmpty()) {
      out.println();
      Table derived = new Table("RATIO", "CASE", ">VALUE", "TARGET", "VERDICT");
      for (Ratio ratio : ratios) {
        derived.row(ratio.name(), ratio.label(), fmt(ratio.value()),
            ratio.target() == null ? "-" : ratio.comparison() + " " + fmt(ratio.target()), ratio.verdict());
      }
      derived.print(out);
    }
  }

  private static String us(double micros) {
    return String.format(Locale.ROOT, micros >= 1000 ? "%.0f" : "%.1f", micros);
  }

  private static String fmt(double value) {
    return value >= 1000 ? String.format(Locale.ROOT, "%,.0f", value) : String.format(Locale.ROOT, "%.2f", value);
  }
}
