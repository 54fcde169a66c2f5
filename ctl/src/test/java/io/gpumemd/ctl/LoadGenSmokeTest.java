package io.gpumemd.ctl;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.pool.PoolMetric;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ListValue;
import com.google.protobuf.Struct;
import com.google.protobuf.Value;
import com.google.protobuf.util.JsonFormat;
import io.gpumemd.server.testing.TestDaemon;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code gpumemctl loadgen} runs every scenario for a fraction of a second against a live
 * daemon and reports sane figures. Checks shape and consistency only: timings on a shared
 * test machine prove nothing, so no thresholds.
 */
class LoadGenSmokeTest {
  private TestDaemon daemon;
  @TempDir
  Path tmp;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  private CtlRun loadgen(String... flags) {
    String[] args = Stream.concat(Stream.of("--target", daemon.unixTarget(), "loadgen"), Stream.of(flags))
        .toArray(String[]::new);
    return CtlRun.of(args);
  }

  private static double num(Struct s, String field) {
    assertTrue(s.containsFields(field), field + " in " + s);
    return s.getFieldsOrThrow(field).getNumberValue();
  }

  @Test
  void everyScenario_reportsCountsPercentilesAndRatios_asJson() throws Exception {
    Path jsonFile = tmp.resolve("report.json");
    CtlRun r = loadgen("--seconds", "0.2", "--warmup-seconds", "0.05", "--jit-warmup-seconds", "0.1",
        "--proc-warmup-seconds", "0.05", "--json", "--json-out", jsonFile.toString(),
        "--threads", "4", "--in-flight", "8", "--procs", "2", "--proc-threads", "2",
        "--baseline-dir", tmp.toString());
    assertEquals(0, r.code(), r.err());

    Struct.Builder parsed = Struct.newBuilder();
    JsonFormat.parser().merge(r.out(), parsed);
    Struct report = parsed.build();
    assertEquals(r.out().strip(), Files.readString(jsonFile).strip(), "--json-out writes the same report");
    assertTrue(num(report.getFieldsOrThrow("environment").getStructValue(), "cpus") >= 1);

    List<Value> results = report.getFieldsOrThrow("results").getListValue().getValuesList();
    Set<String> cases = new TreeSet<>();
    for (Value v : results) {
      Struct c = v.getStructValue();
      String name = c.getFieldsOrThrow("scenario").getStringValue() + "/" + c.getFieldsOrThrow("case").getStringValue();
      cases.add(name);
      assertEquals(0, num(c, "errors"), name + ": " + c);
      assertTrue(num(c, "ops") > 0, name);
      assertTrue(num(c, "seconds") > 0, name);
      assertTrue(num(c, "opsPerSecond") > 0, name);
      Struct latency = c.getFieldsOrThrow("latencyUs").getStructValue();
      assertTrue(num(latency, "p50") > 0, name);
      assertTrue(num(latency, "p50") <= num(latency, "p90"), name);
      assertTrue(num(latency, "p90") <= num(latency, "p99"), name);
      assertTrue(num(latency, "p99") <= num(latency, "p999"), name);
      assertTrue(num(latency, "p999") <= num(latency, "max"), name);
      if (name.startsWith("local/")) {
        // Warm-up and measured window together: all local but the first lease of the size.
        assertTrue(num(c, "localHits") >= num(c, "ops"), name + ": every measured lease served locally " + c);
        assertTrue(num(c, "daemonLeases") <= 1, name + ": at most the first lease went to the daemon " + c);
      }
      if (!name.startsWith("floor") && !name.startsWith("baseline") && !name.startsWith("close")
          && !name.startsWith("pressure")) {
        assertTrue(num(c, "poolHitPercent") > 0, name + ": a warm pool serves hits");
      }
      if (name.startsWith("hit/")) {
        assertEquals(100, num(c, "poolHitPercent"), name);
        assertEquals(0, num(c, "mappingsOpened"), name + ": the hit path maps nothing");
      }
    }
    assertEquals(new TreeSet<>(List.of("floor/health check", "local/4KiB", "local/2MiB", "local/64MiB",
        "stream/4KiB", "stream/2MiB", "stream/64MiB", "close/close() x 4KiB", "pairs/4KiB", "pairs/2MiB", "pairs/64MiB",
        "stream-async/8 in flight x 4KiB", "threads/4 threads x 4KiB", "async/8 in flight x 4KiB",
        "procs/2 procs x 2 threads x 4KiB", "pressure/lease needing another process's cached 64MiB",
        "baseline/4KiB", "baseline/2MiB", "baseline/16MiB", "baseline/64MiB",
        "hit/4KiB", "hit/2MiB", "hit/16MiB", "hit/64MiB")), cases);

    ListValue ratios = report.getFieldsOrThrow("ratios").getListValue();
    Set<String> ratioNames = ratios.getValuesList().stream()
        .map(v -> v.getStructValue().getFieldsOrThrow("name").getStringValue() + "/"
            + v.getStructValue().getFieldsOrThrow("case").getStringValue())
        .collect(Collectors.toCollection(TreeSet::new));
    assertTrue(ratioNames.containsAll(List.of("pair p50 / (2 x health p50)/4KiB", "pair p99 / (2 x health p50)/4KiB",
        "async pairs/s/8 in flight x 4KiB", "baseline p50 / hit p50/16MiB", "local hit p50 (us)/64MiB",
        "stream lease+close p50 / health p50/2MiB", "close() p50 (us)/close() x 4KiB",
        "stream-async pairs/s / unary async pairs/s/8 in flight x 4KiB",
        "pressure lease max - health p50 (us)/lease needing another process's cached 64MiB")), ratioNames.toString());
    for (Value v : ratios.getValuesList()) {
      assertTrue(num(v.getStructValue(), "value") > 0, v.toString());
    }

    try (Stream<Path> left = Files.list(tmp)) {
      assertEquals(List.of(jsonFile), left.toList(), "the baseline deletes its files");
    }
    assertEquals(0, daemon.server().registry().sessions(Caller.DAEMON).size(), "loadgen and its children closed their sessions");
    assertTrue(daemon.server().pools().get(0).stats().get(PoolMetric.HITS) > 0);
  }

  @Test
  void someScenarios_printTableWithRatios() {
    CtlRun r = loadgen("--scenarios", "pairs,floor", "--pair-sizes", "4KiB", "--seconds", "0.1", "--warmup-seconds", "0",
        "--jit-warmup-seconds", "0");
    assertEquals(0, r.code(), r.err());
    List<String> lines = r.out().lines().toList();
    assertTrue(lines.get(0).startsWith("gpumemd load generator: " + daemon.unixTarget()), lines.get(0));
    assertTrue(lines.stream().anyMatch(l -> l.startsWith("SCENARIO  CASE")), r.out());
    assertTrue(lines.stream().anyMatch(l -> l.matches("floor\\s+health check\\s+\\d+.*")), r.out());
    assertTrue(lines.stream().anyMatch(l -> l.matches("pairs\\s+4KiB\\s+\\d+.*")), r.out());
    assertTrue(lines.stream().anyMatch(l -> l.startsWith("RATIO")), r.out());
    assertTrue(lines.stream().anyMatch(l -> l.matches("pair p50 / \\(2 x health p50\\)\\s+4KiB\\s+[0-9.]+\\s+<= 1\\.70\\s+(met|missed)")),
        r.out());
    assertTrue(r.err().contains("loadgen: floor"), "progress goes to stderr: " + r.err());
  }
}
