package io.gpumemd.ctl;

import java.util.LinkedHashMap;
import java.util.Map;
import org.HdrHistogram.Histogram;

/**
 * One measured case of the load generator: how many operations completed in the measured
 * window (warm-up excluded), how long the window lasted, and the latency histogram in
 * nanoseconds. Not modified once built, except that the case that built it may add details.
 */
final class LoadResult {
  final String scenario;
  final String label;
  final long ops;
  final long elapsedNanos;
  final Histogram latency;
  /** Leases in the window that were not pool hits; -1 where the case leases nothing. */
  final long misses;
  final long errors;
  final String firstError;
  final Map<String, Object> details;

  LoadResult(String scenario, String label, long ops, long elapsedNanos, Histogram latency, long misses,
      long errors, String firstError, Map<String, Object> details) {
    this.scenario = scenario;
    this.label = label;
    this.ops = ops;
    this.elapsedNanos = elapsedNanos;
    this.latency = latency;
    this.misses = misses;
    this.errors = errors;
    this.firstError = firstError;
    this.details = new LinkedHashMap<>(details);
  }

  double opsPerSecond() {
    return elapsedNanos <= 0 ? 0 : ops * 1e9 / elapsedNanos;
  }

  /** Latency at a percentile (e.g. 99.9), in microseconds; 0 without samples. */
  double micros(double percentile) {
    return latency.getTotalCount() == 0 ? 0 : latency.getValueAtPercentile(percentile) / 1000.0;
  }

  double meanMicros() {
    return latency.getTotalCount() == 0 ? 0 : latency.getMean() / 1000.0;
  }

  double maxMicros() {
    return latency.getTotalCount() == 0 ? 0 : latency.getMaxValue() / 1000.0;
  }

  /** Percent of leases served from the pool's cache, or null where nothing was leased. */
  Double hitPercent() {
    return misses < 0 || ops == 0 ? null : 100.0 * (ops - misses) / ops;
  }

  Map<String, Object> toJson() {
    Map<String, Object> json = new LinkedHashMap<>();
    json.put("scenario", scenario);
    json.put("case", label);
    json.put("ops", ops);
    json.put("seconds", elapsedNanos / 1e9);
    json.put("opsPerSecond", opsPerSecond());
    Map<String, Object> latencyUs = new LinkedHashMap<>();
    latencyUs.put("p50", micros(50));
    latencyUs.put("p90", micros(90));
    latencyUs.put("p99", micros(99));
    latencyUs.put("p999", micros(99.9));
    latencyUs.put("max", maxMicros());
    latencyUs.put("mean", meanMicros());
    json.put("latencyUs", latencyUs);
    if (hitPercent() != null) {
      json.put("poolHitPercent", hitPercent());
    }
    json.put("errors", errors);
    if (firstError != null) {
      json.put("firstError", firstError);
    }
    json.putAll(details);
    return json;
  }
}
