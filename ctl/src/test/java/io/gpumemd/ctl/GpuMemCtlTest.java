package io.gpumemd.ctl;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.pool.PoolMetric;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Message;
import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.GetStatsResponse;
import io.gpumemd.proto.v1.ListDevicesResponse;
import io.gpumemd.proto.v1.ListLeasesResponse;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.proto.v1.ListObjectsResponse;
import io.gpumemd.proto.v1.ParkObjectResponse;
import io.gpumemd.proto.v1.UnpublishResponse;
import io.gpumemd.client.Share;
import io.gpumemd.proto.v1.SetRetentionCapResponse;
import io.gpumemd.proto.v1.TrimResponse;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.health.v1.HealthCheckResponse;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * {@code gpumemctl} against a live daemon on the host backend: every command in-process with
 * captured output, plus real {@code java ... GpuMemCtl} processes for exit codes and SIGTERM.
 */
class GpuMemCtlTest {
  private TestDaemon daemon;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  /** Runs gpumemctl in-process against the daemon's Unix socket. */
  private CtlRun ctl(String... args) {
    String[] full = Stream.concat(Stream.of("--target", daemon.unixTarget()), Arrays.stream(args)).toArray(String[]::new);
    return ctlRaw(full);
  }

  private static CtlRun ctlRaw(String... args) {
    return CtlRun.of(args);
  }


  private static <T extends Message.Builder> T parse(String json, T builder) throws IOException {
    JsonFormat.parser().merge(json, builder);
    return builder;
  }

  private static void assertOk(CtlRun r) {
    assertEquals(0, r.code(), () -> "exit code; stderr: " + r.err() + "\nstdout: " + r.out());
    assertEquals("", r.err(), "stderr");
  }

  private PoolStats stats(int device) {
    return daemon.server().pools().get(device).stats();
  }

  // ---------------------------------------------------------------------------- inspection

  @Test
  void devices_listsEveryHostDevice_asTableAndJson() throws IOException {
    CtlRun table = ctl("devices");
    assertOk(table);
    String[] lines = table.out().split("\n");
    assertEquals(3, lines.length, table.out());
    assertTrue(lines[0].startsWith("DEVICE  NAME"), lines[0]);
    assertTrue(lines[1].matches("\\s*0\\s+host-shm\\s+host\\s+256\\.0 MiB\\s+256\\.0 MiB.*"), lines[1]);
    assertTrue(lines[2].matches("\\s*1\\s+host-shm\\s+host\\s+256\\.0 MiB.*"), lines[2]);

    CtlRun json = ctl("--json", "devices");
    assertOk(json);
    ListDevicesResponse devices = parse(json.out(), ListDevicesResponse.newBuilder()).build();
    assertEquals(2, devices.getDevicesCount());
    assertEquals(256L << 20, devices.getDevices(1).getCapacityBytes());
    assertEquals("host", devices.getDevices(0).getBackend());
  }

  @Test
  void stats_json_hasHitsAndMisses() throws IOException {
    // Client cache off: both leases are the daemon's to serve (the second a pool hit).
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      client.lease(0, 4096).close();  // miss
      client.lease(0, 4096).close();  // hit
    }
    CtlRun json = ctl("stats", "--device", "0", "--json");  // flags after the command work too
    assertOk(json);
    assertTrue(json.out().contains("\"hits\": \"1\""), json.out());
    GetStatsResponse stats = parse(json.out(), GetStatsResponse.newBuilder()).build();
    assertEquals(1, stats.getDevicesCount());
    assertEquals(0, stats.getDevices(0).getDevice());
    assertEquals(1, stats.getDevices(0).getHits());
    assertEquals(1, stats.getDevices(0).getMisses());
    assertEquals(2, stats.getDevices(0).getReturns());

    CtlRun table = ctl("stats");
    assertOk(table);
    assertTrue(table.out().lines().anyMatch(l -> l.matches("\\s+DEVICE 0\\s+DEVICE 1")), table.out());
    assertTrue(table.out().lines().anyMatch(l -> l.matches("hit rate\\s+50\\.0%\\s+-")), table.out());
    assertTrue(table.out().lines().anyMatch(l -> l.matches("misses\\s+1\\s+0")), table.out());
    assertTrue(table.out().lines().anyMatch(l -> l.matches("cached\\s+2\\.0 MiB\\s+0 B")), table.out());
  }

  @Test
  void stats_hitRate_staysAPercentage_whenClientCountersAreSaturated() {
    // Clients' reported hits saturate at Long.MAX_VALUE (issue 22); the hit rate's sums must not wrap.
    daemon.server().pools().get(0).addClientCounters(Long.MAX_VALUE, 0);
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      client.lease(0, 4096).close(); // a miss as well
    }
    CtlRun table = ctl("stats");
    assertOk(table);
    assertTrue(table.out().lines().anyMatch(l -> l.matches("hit rate\\s+100\\.0%\\s+-")), table.out());
    assertTrue(table.out().lines().anyMatch(l -> l.matches("client cache hits\\s+" + Long.MAX_VALUE + "\\s+0")),
        table.out());
  }

  @Test
  void leases_listsLeaseIdAndTag_andFilters() throws IOException {
    try (GpuMemClient client = GpuMemClient.builder(daemon.tcpTarget()).clientName("ctl-leases").connect();
         Lease lease = client.lease(1, 3 << 20, false, "kv-cache")) {
      CtlRun table = ctl("leases");
      assertOk(table);
      String row = table.out().lines().filter(l -> l.startsWith(lease.id())).findFirst().orElseThrow(
          () -> new AssertionError("lease " + lease.id() + " not listed:\n" + table.out()));
      assertTrue(row.contains(client.sessionId()), row);
      assertTrue(row.contains("ctl-leases"), row);
      assertTrue(row.contains("kv-cache"), row);
      assertTrue(row.contains("3.0 MiB"), row);

      CtlRun bySession = ctl("leases", "--session", client.sessionId(), "--json");
      assertOk(bySession);
      ListLeasesResponse leases = parse(bySession.out(), ListLeasesResponse.newBuilder()).build();
      assertEquals(1, leases.getLeasesCount());
      assertEquals(lease.id(), leases.getLeases(0).getLeaseId());
      assertEquals("kv-cache", leases.getLeases(0).getTag());
      assertEquals(1, leases.getLeases(0).getDevice());

      CtlRun otherDevice = ctl("leases", "--device", "0");
      assertOk(otherDevice);
      assertEquals("no live leases\n", otherDevice.out());
    }
  }

  @Test
  void sessions_listsClientWithItsLeases() throws IOException {
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName("ctl-sessions").connect();
         Lease a = client.lease(0, 4096);
         Lease b = client.lease(0, 1 << 20)) {
      CtlRun table = ctl("sessions");
      assertOk(table);
      assertTrue(table.out().startsWith("SESSION"), table.out());
      String row = table.out().lines().filter(l -> l.contains("ctl-sessions")).findFirst().orElseThrow();
      assertTrue(row.startsWith(client.sessionId()), row);
      assertTrue(row.matches(".*ctl-sessions\\s+uid:0\\s+uid 0 gid 0 pid " + ProcessHandle.current().pid() + "\\s+2\\s+1\\.0 MiB\\s+0 B\\s+64\\.0 MiB\\s+1\\s+attached.*"), row);

      ListSessionsResponse json = parse(ctl("sessions", "--json").out(), ListSessionsResponse.newBuilder()).build();
      assertEquals(1, json.getSessionsCount());
      assertEquals(2, json.getSessions(0).getLeases());
      assertEquals(a.blockBytes() + b.blockBytes(), json.getSessions(0).getLeasedBytes());
    }
    assertEquals("no live sessions\n", ctl("sessions").out());
  }

  @Test
  void sessions_followsPages_hundredThousandSessions() throws IOException {
    daemon.close();
    daemon = TestDaemon.start("--max-sessions", "200000");
    for (int i = 0; i < 100_000; i++) {
      daemon.server().registry().open(Caller.DAEMON, "bulk-" + (i % 10), 0, -1);
    }
    CtlRun table = ctl("sessions");
    assertOk(table);
    List<String> rows = table.out().lines().skip(1).toList();
    assertEquals(100_000, rows.size(), "every session, over 100 pages");
    assertEquals(100_000, rows.stream().map(r -> r.substring(0, 32)).distinct().count(), "none twice");
  }

  @Test
  void leasesAndJson_followPages_upToTheLimit() throws IOException {
    for (int i = 0; i < 2100; i++) {
      daemon.server().registry().open(Caller.DAEMON, "idle-" + i, 0, -1);
    }
    ListSessionsResponse sessions = parse(ctl("sessions", "--json").out(), ListSessionsResponse.newBuilder()).build();
    assertEquals(2100, sessions.getSessionsCount(), "one response made of three pages");
    assertEquals(2100, sessions.getTotal());
    assertEquals("", sessions.getNextPageToken());
    String session = daemon.server().registry().open(Caller.DAEMON, "many", 0, -1).id();
    for (int i = 0; i < 2500; i++) {
      daemon.server().registry().lease(Caller.DAEMON, session, 0, 512, false, "", false);
    }
    CtlRun all = ctl("leases");
    assertOk(all);
    assertEquals(2500, all.out().lines().skip(1).count(), "three pages, no note");
    CtlRun some = ctl("leases", "--limit", "1500");
    assertOk(some);
    List<String> lines = some.out().lines().toList();
    assertEquals(1 + 1500 + 1, lines.size());
    assertEquals("(1500 of 2500 leases; --limit 0 shows all)", lines.get(lines.size() - 1));
    ListLeasesResponse json = parse(ctl("leases", "--limit", "1200", "--json").out(), ListLeasesResponse.newBuilder()).build();
    assertEquals(1200, json.getLeasesCount());
    assertEquals(2500, json.getTotal());
  }

  // ---------------------------------------------------------------------------- sharing

  @Test
  void leases_showHolds_andMarkAttachedHolds() throws IOException {
    try (GpuMemClient owner = GpuMemClient.builder(daemon.unixTarget()).clientName("producer").connect();
         GpuMemClient consumer = GpuMemClient.builder(daemon.unixTarget()).clientName("consumer").connect();
         Lease lease = owner.lease(0, 8192, false, "batch");
         Lease plain = owner.lease(0, 4096)) {
      Share share = lease.share(java.time.Duration.ZERO, true, 0);
      try (Lease hold = consumer.attach(share.token(), "reader")) {
        CtlRun table = ctl("leases");
        assertOk(table);
        assertTrue(table.out().lines().findFirst().orElseThrow().matches(".*OFFSET\\s+HOLDS\\s+SHARING"), table.out());
        String ownerRow = row(table, lease.id());
        String holdRow = row(table, hold.id());
        String plainRow = row(table, plain.id());
        // the lease, the token and the attached hold: three holds on the block
        assertTrue(ownerRow.matches(".*\\s3\\s+shared"), ownerRow);
        assertTrue(holdRow.matches(".*reader.*\\s3\\s+attached,ro"), holdRow);
        assertTrue(plainRow.matches(".*\\s1\\s+-"), plainRow);

        ListLeasesResponse json = parse(ctl("leases", "--session", consumer.sessionId(), "--json").out(),
            ListLeasesResponse.newBuilder()).build();
        assertEquals(1, json.getLeasesCount());
        assertTrue(json.getLeases(0).getAttached());
        assertTrue(json.getLeases(0).getReadOnly());
        assertEquals(3, json.getLeases(0).getHolds());
      }
      share.close();
    }
    assertEquals(0, stats(0).get(PoolMetric.LEASED_BYTES));
  }

  private static String row(CtlRun table, String leaseId) {
    return table.out().lines().filter(l -> l.startsWith(leaseId)).findFirst().orElseThrow(
        () -> new AssertionError(leaseId + " not listed:\n" + table.out()));
  }

  @Test
  void objects_listsPublishedObjectsWithHolders_andRmRemovesThem() throws IOException {
    assertEquals("no published objects\n", ctl("objects").out());
    try (GpuMemClient owner = GpuMemClient.builder(daemon.unixTarget()).clientName("loader").connect()) {
      try (Lease lease = owner.lease(0, 3 << 20)) {
        owner.publish(lease, "llama-3-8b/layer-0", true);
        owner.publish(lease, "alias");
      }
    }
    try (GpuMemClient worker = GpuMemClient.builder(daemon.unixTarget()).clientName("worker").connect();
         Lease hold = worker.lookup("llama-3-8b/layer-0")) {
      CtlRun table = ctl("objects");
      assertOk(table);
      List<String> lines = table.out().lines().toList();
      assertEquals(3, lines.size(), table.out());
      assertTrue(lines.get(0).matches("NAME\\s+TENANT\\s+DEVICE\\s+SIZE\\s+HOLDS\\s+HOLDERS\\s+AGE\\s+RO\\s+PARKED"),
          lines.get(0));
      // by name: "alias" first; two names and the worker's hold: three holds, one holder
      assertTrue(lines.get(1).matches("alias\\s+uid:0\\s+0\\s+3\\.0 MiB\\s+3\\s+1\\s+\\S+ \\S+\\s+no\\s+no"), lines.get(1));
      assertTrue(lines.get(2).matches("llama-3-8b/layer-0\\s+uid:0\\s+0\\s+3\\.0 MiB\\s+3\\s+1\\s+\\S+ \\S+\\s+yes\\s+no"),
          lines.get(2));

      ListObjectsResponse json = parse(ctl("objects", "--json").out(), ListObjectsResponse.newBuilder()).build();
      assertEquals(2, json.getObjectsCount());
      assertEquals(2, json.getTotal());
      assertEquals("llama-3-8b/layer-0", json.getObjects(1).getName());
      assertEquals(3 << 20, json.getObjects(1).getSizeBytes());
      assertTrue(json.getObjects(1).getReadOnly());
      assertEquals(1, json.getObjects(1).getLookups());

      CtlRun rm = ctl("objects", "rm", "llama-3-8b/layer-0");
      assertOk(rm);
      assertEquals("removed object 'llama-3-8b/layer-0'; its block stays leased until its other holders release it\n",
          rm.out());
      CtlRun again = ctl("objects", "rm", "llama-3-8b/layer-0");
      assertEquals(1, again.code(), again.out());
      assertTrue(again.err().startsWith("gpumemctl: NOT_FOUND: "), again.err());
    }
    CtlRun rmJson = ctl("--json", "objects", "rm", "alias", "--tenant", "uid:0");
    assertOk(rmJson);
    assertTrue(parse(rmJson.out(), UnpublishResponse.newBuilder()).build().getBlockReturned(), rmJson.out());
    assertEquals("no published objects\n", ctl("objects").out());
    assertEquals(0, stats(0).get(PoolMetric.LEASED_BYTES));
  }

  @Test
  void objectsPark_parksAnObjectOnlyItsNameHolds_andALookupBringsItBack() throws IOException {
    try (GpuMemClient owner = GpuMemClient.builder(daemon.unixTarget()).clientName("loader").connect()) {
      try (Lease lease = owner.lease(0, 3 << 20)) {
        owner.publish(lease, "weights", true);
        try (GpuMemClient worker = GpuMemClient.builder(daemon.unixTarget()).clientName("worker").connect();
             Lease hold = worker.lookup("weights")) {
          CtlRun held = ctl("objects", "park", "weights");
          assertEquals(1, held.code(), held.out());
          assertTrue(held.err().startsWith("gpumemctl: FAILED_PRECONDITION: "), held.err());
        }
      }
    }

    CtlRun park = ctl("objects", "park", "weights");

    assertOk(park);
    assertEquals("parked object 'weights': 4.0 MiB in host memory, 4.0 MiB of device memory freed\n", park.out());
    assertEquals(0, stats(0).get(PoolMetric.LEASED_BYTES));
    String row = ctl("objects").out().lines().filter(l -> l.startsWith("weights")).findFirst().orElseThrow();
    assertTrue(row.endsWith("4.0 MiB in host memory"), row);
    ParkObjectResponse json = parse(ctl("--json", "objects", "park", "weights", "--tenant", "uid:0").out(),
        ParkObjectResponse.newBuilder()).build();
    assertEquals(0, json.getFreedBytes(), "parked already");
    try (GpuMemClient worker = GpuMemClient.builder(daemon.unixTarget()).clientName("worker").connect();
         Lease hold = worker.lookup("weights")) {
      assertEquals(4 << 20, stats(0).get(PoolMetric.LEASED_BYTES));
      assertTrue(ctl("objects").out().lines().filter(l -> l.startsWith("weights")).findFirst().orElseThrow()
          .endsWith("no"));
    }
    assertOk(ctl("objects", "rm", "weights"));
  }

  @Test
  void objectsRm_withoutAName_isAUsageError() {
    CtlRun r = ctl("objects", "rm");
    assertEquals(2, r.code(), r.err());
    assertEquals("", r.out());
    assertTrue(r.err().contains("NAME"), r.err());
    assertTrue(r.err().contains("objects rm --help"), r.err());
  }

  // ---------------------------------------------------------------------------- cache control

  @Test
  void trim_freesCachedBytes() throws IOException {
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      client.lease(0, 8 << 20).close();
      client.lease(1, 4 << 20).close();
    }
    assertEquals(8L << 20, stats(0).get(PoolMetric.CACHED_BYTES));

    CtlRun device0 = ctl("trim", "--keep-bytes", "0", "--device", "0");
    assertOk(device0);
    assertEquals("freed 8.0 MiB (8388608 bytes) on device 0, keeping at most 0 B cached per device\n", device0.out());
    assertEquals(0, stats(0).get(PoolMetric.CACHED_BYTES));
    assertEquals(4L << 20, stats(1).get(PoolMetric.CACHED_BYTES));

    CtlRun rest = ctl("--json", "trim", "--keep-bytes=0KiB");
    assertOk(rest);
    assertEquals(4L << 20, parse(rest.out(), TrimResponse.newBuilder()).getFreedBytes());
    assertEquals(0, stats(1).get(PoolMetric.CACHED_BYTES));
    assertEquals(0, daemon.segmentFiles(1));
  }

  @Test
  void setCap_zero_evictsAndDisablesCaching() throws IOException {
    // Unary calls: the release has landed in the daemon's cache when close() returns.
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      client.lease(0, 4 << 20).close();
      assertEquals(4L << 20, stats(0).get(PoolMetric.CACHED_BYTES));

      CtlRun r = ctl("set-cap", "--cap-bytes", "0", "--device", "0", "--json");
      assertOk(r);
      assertEquals(4L << 20, parse(r.out(), SetRetentionCapResponse.newBuilder()).getEvictedBytes());
      assertEquals(0, stats(0).get(PoolMetric.RETENTION_CAP_BYTES));
      assertEquals(0, stats(0).get(PoolMetric.CACHED_BYTES));
      assertTrue(stats(0).get(PoolMetric.EVICTIONS) >= 1);

      client.lease(0, 4 << 20).close();  // with cap 0 nothing is kept
      assertEquals(0, stats(0).get(PoolMetric.CACHED_BYTES));

      CtlRun back = ctl("set-cap", "--cap-bytes", "64MiB");
      assertOk(back);
      assertEquals("retention cap set to 64.0 MiB on all devices: evicted 0 B (0 bytes)\n", back.out());
      assertEquals(64L << 20, stats(1).get(PoolMetric.RETENTION_CAP_BYTES));
    }
  }

  // ---------------------------------------------------------------------------- health

  @Test
  void health_serving_exitsZero_overBothListeners() throws IOException {
    CtlRun unix = ctl("health");
    assertOk(unix);
    assertEquals("SERVING\n", unix.out());

    CtlRun tcp = ctlRaw("--target", daemon.tcpTarget(), "--json", "health", "--service", "gpumemd.v1.Allocator");
    assertOk(tcp);
    HealthCheckResponse response = parse(tcp.out(), HealthCheckResponse.newBuilder()).build();
    assertEquals(HealthCheckResponse.ServingStatus.SERVING, response.getStatus());
  }

  @Test
  void health_unknownService_exitsOne() {
    CtlRun r = ctl("health", "--service", "no.such.Service");
    assertEquals(1, r.code());
    assertTrue(r.err().startsWith("gpumemctl: NOT_FOUND: "), r.err());
  }

  // ---------------------------------------------------------------------------- errors

  @Test
  void unknownDevice_exitsOne_withInvalidArgument() {
    for (String command : List.of("stats", "leases", "trim", "set-cap")) {
      List<String> args = new ArrayList<>(List.of(command, "--device", "7"));
      if (command.equals("trim")) {
        args.addAll(List.of("--keep-bytes", "0"));
      } else if (command.equals("set-cap")) {
        args.addAll(List.of("--cap-bytes", "0"));
      }
      CtlRun r = ctl(args.toArray(String[]::new));
      assertEquals(1, r.code(), command);
      assertEquals("", r.out(), command);
      assertTrue(r.err().startsWith("gpumemctl: INVALID_ARGUMENT: "), command + ": " + r.err());
      assertTrue(r.err().contains("7"), r.err());
    }
    assertEquals(256L << 20, stats(0).get(PoolMetric.RETENTION_CAP_BYTES), "a refused set-cap changes nothing");
  }

  @Test
  void badCommandLines_exitTwo_withoutOutput() {
    List<String[]> bad = List.of(
        new String[] {},
        new String[] {"frobnicate"},
        new String[] {"stats", "--devcie", "0"},
        new String[] {"stats", "--device", "zero"},
        new String[] {"stats", "--device"},
        new String[] {"trim"},
        new String[] {"trim", "--keep-bytes", "12XB"},
        new String[] {"set-cap", "--cap-bytes", "-1"},
        new String[] {"devices", "extra"},
        new String[] {"devices", "--json=yes"},
        new String[] {"worker", "--size", "0"},
        new String[] {"loadgen", "--scenarios", "floor,warp"},
        new String[] {"loadgen", "--seconds", "soon"});
    for (String[] args : bad) {
      CtlRun r = ctl(args);
      assertEquals(2, r.code(), () -> String.join(" ", args) + ": " + r.err());
      assertEquals("", r.out(), String.join(" ", args));
      assertTrue(r.err().startsWith("gpumemctl: "), r.err());
    }
    CtlRun malformedTarget = ctlRaw("--target", "no-port-here", "devices");
    assertEquals(2, malformedTarget.code(), malformedTarget.err());
    assertTrue(malformedTarget.err().contains("expected: unix:///path/to.sock or host:port"), malformedTarget.err());
  }

  @Test
  void manyInvalidValues_areReportedTogether_eachWithItsFlag_exitTwo() {
    CtlRun r = ctl("worker", "--size", "12 parsecs", "--device", "x", "--hold-ms", "-5", "--iterations", "2");
    assertEquals(2, r.code(), r.err());
    assertEquals("", r.out());
    List<String> lines = r.err().lines().toList();
    assertEquals(List.of(
        "gpumemctl: --size: '12 parsecs' (expected: a byte size with suffix B, KiB, MiB, GiB or TiB)",
        "gpumemctl: --device: 'x' (expected: an integer)",
        "gpumemctl: --hold-ms: '-5' (expected: an integer in [0, " + Long.MAX_VALUE + "])",
        "Run 'gpumemctl worker --help' for usage."), lines);
    assertEquals(0, daemon.server().registry().sessions(Caller.DAEMON).size(), "a usage error contacts no daemon");

    CtlRun ranges = ctl("loadgen", "--threads", "0", "--seconds", "soon", "--scenarios", "floor,warp", "--procs=999");
    assertEquals(2, ranges.code(), ranges.err());
    assertEquals(List.of(
        "gpumemctl: --seconds: 'soon' (expected: a number such as 5 or 0.25)",
        "gpumemctl: --scenarios: 'warp' (expected: a comma-separated list of floor, local, stream, close, pairs, "
            + "stream-async, async, threads, procs, pressure, baseline, hit)",
        "gpumemctl: --threads: '0' (expected: an integer in [1, 4096])",
        "gpumemctl: --procs: '999' (expected: an integer in [1, 256])"),
        ranges.err().lines().filter(l -> l.startsWith("gpumemctl: ")).toList());
  }

  @Test
  void usageErrors_nameTheFlag_andWhatWasExpected() {
    assertEquals("gpumemctl: --keep-bytes: required (e.g. --keep-bytes 64MiB)", firstLine(ctl("trim")));
    assertEquals("gpumemctl: --device: missing value", firstLine(ctl("stats", "--device")));
    assertEquals("gpumemctl: --json: 'yes' (expected: no value: it is a switch)", firstLine(ctl("devices", "--json=yes")));
    CtlRun typo = ctl("stats", "--devcie", "0");
    assertEquals(List.of("gpumemctl: --devcie: unknown flag for 'gpumemctl stats' (expected one of: --device, --target, "
        + "--tls-ca, --tls-cert, --tls-key, --token-file, --json, --help)", "Run 'gpumemctl stats --help' for usage."), typo.err().lines().toList());
    assertTrue(firstLine(ctl("frobnicate")).startsWith("gpumemctl: unknown command 'frobnicate' (expected one of: devices, "),
        ctl("frobnicate").err());
  }

  private static String firstLine(CtlRun r) {
    assertEquals(2, r.code(), r.err());
    return r.err().lines().findFirst().orElse("");
  }

  @Test
  void targetFromEnvironment_isTheDefault_andTargetFlagOverridesIt() {
    CtlRun fromEnv = CtlRun.withEnv(Map.of("GPUMEMD_TARGET", daemon.unixTarget()), "health");
    assertOk(fromEnv);
    assertEquals("SERVING\n", fromEnv.out());

    String nowhere = "unix:///tmp/gpumemctl-test-env-nowhere.sock";
    CtlRun envUsed = CtlRun.withEnv(Map.of("GPUMEMD_TARGET", nowhere), "devices");
    assertEquals(1, envUsed.code(), envUsed.err());
    assertTrue(envUsed.err().contains("(target " + nowhere + ")"), envUsed.err());

    CtlRun flagWins = CtlRun.withEnv(Map.of("GPUMEMD_TARGET", nowhere), "devices", "--target", daemon.tcpTarget());
    assertOk(flagWins);
    assertTrue(flagWins.out().startsWith("DEVICE"), flagWins.out());
  }

  @Test
  void completion_printsBashScript_namingEveryCommand_thatBashAccepts() throws Exception {
    CtlRun r = ctlRaw("completion");
    assertOk(r);
    List<String> commands = List.of("devices", "stats", "leases", "sessions", "objects", "shares", "revoke-share",
        "trim", "set-cap", "sleep", "wake", "health", "worker", "loadgen", "completion");
    String commandList = r.out().lines().map(String::trim).filter(l -> l.startsWith("local commands=\"devices"))
        .findFirst().orElseThrow(() -> new AssertionError("no top-level command list:\n" + r.out()));
    assertEquals("local commands=\"" + String.join(" ", commands) + "\"", commandList);
    for (String command : commands) {
      assertTrue(r.out().contains("function _picocli_gpumemctl_" + command.replace("-", "") + "()")
          || r.out().contains("function _picocli_gpumemctl_" + command + "()"), "a completion function for " + command);
    }

    Path script = Files.createTempFile("gpumemctl-completion", ".bash");
    try {
      Files.writeString(script, r.out());
      assertEquals("", bash("-n", script.toString()), "bash -n accepts the script");
      // and it completes: 'gpumemctl st<TAB>' offers stats, 'gpumemctl trim --k<TAB>' offers --keep-bytes
      assertEquals("stats", bash("-c", "source " + script + "; COMP_WORDS=(gpumemctl st); COMP_CWORD=1; "
          + "_complete_gpumemctl 2>/dev/null; printf '%s\\n' \"${COMPREPLY[@]}\"").strip());
      assertEquals("--keep-bytes", bash("-c", "source " + script + "; COMP_WORDS=(gpumemctl trim --k); COMP_CWORD=2; "
          + "_complete_gpumemctl 2>/dev/null; printf '%s\\n' \"${COMPREPLY[@]}\"").strip());
    } finally {
      Files.delete(script);
    }
  }

  /** Runs bash; returns its output; fails the test unless it exits 0. */
  private static String bash(String... args) throws Exception {
    List<String> command = new ArrayList<>(List.of("bash"));
    command.addAll(List.of(args));
    Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
    String output = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(30, TimeUnit.SECONDS), "bash did not finish");
    assertEquals(0, p.exitValue(), "bash " + String.join(" ", args) + ": " + output);
    return output;
  }

  @Test
  void unreachableDaemon_exitsOne_withUnavailableAndTarget() {
    CtlRun r = ctlRaw("--target", "unix:///tmp/gpumemctl-test-no-such.sock", "devices");
    assertEquals(1, r.code());
    assertTrue(r.err().startsWith("gpumemctl: UNAVAILABLE: "), r.err());
    assertTrue(r.err().contains("unix:///tmp/gpumemctl-test-no-such.sock"), r.err());
  }

  @Test
  void help_printsUsage_exitsZero() {
    CtlRun r = ctlRaw("--help");
    assertOk(r);
    assertTrue(r.out().startsWith("Usage: gpumemctl"), r.out());
    for (String command : List.of("devices", "stats", "leases", "sessions", "trim", "set-cap", "health", "worker", "loadgen")) {
      assertTrue(r.out().contains("\n  " + command + " "), command);
    }
    CtlRun loadgen = ctlRaw("loadgen", "--help");
    assertOk(loadgen);
    assertTrue(loadgen.out().contains("--scenarios"), loadgen.out());

    // picocli's generated help, per command, with the inherited global flags
    CtlRun stats = ctlRaw("stats", "--help");
    assertOk(stats);
    assertTrue(stats.out().startsWith("Usage: gpumemctl stats "), stats.out());
    for (String flag : List.of("--device=N", "--json", "--target=TARGET", "--help")) {
      assertTrue(stats.out().contains(flag), flag + " in\n" + stats.out());
    }
    CtlRun trimHelp = ctlRaw("--target", "unix:///x.sock", "trim", "-h");
    assertOk(trimHelp);
    assertTrue(trimHelp.out().contains("--keep-bytes=SIZE"), trimHelp.out());
  }

  // ---------------------------------------------------------------------------- worker

  @Test
  void worker_inProcess_runsIterations_thenReleasesEverything() {
    CtlRun r = ctl("worker", "--iterations", "3", "--hold-ms", "1", "--size", "64KiB", "--device", "1", "--name", "w1");
    assertOk(r);
    List<String> iterations = r.out().lines().filter(l -> l.contains(" worker: iteration ")).toList();
    assertEquals(3, iterations.size(), r.out());
    assertTrue(iterations.get(0).contains("(miss)"), iterations.get(0));
    assertTrue(iterations.get(2).contains("(pool hit)"), iterations.get(2));
    assertTrue(iterations.stream().allMatch(l -> l.contains("64.0 KiB on device 1") && l.contains("pattern verified")));
    assertTrue(r.out().contains("stopped after 3 iteration(s)"), r.out());
    // Iterations 2 and 3 were hits: the daemon's, or the worker's own cache (reported to it).
    assertEquals(2, stats(1).get(PoolMetric.HITS) + stats(1).get(PoolMetric.CLIENT_CACHE_HITS));
    assertEquals(0, stats(1).get(PoolMetric.ACTIVE_LEASES));
    assertEquals(0, daemon.server().registry().sessions(Caller.DAEMON).size());
  }

  @Test
  void worker_realProcess_sigterm_exitsZeroAndReleases() throws Exception {
    List<String> command = DaemonProcess.javaCommand(GpuMemCtl.class.getName());
    command.addAll(List.of("worker", "--iterations", "0", "--hold-ms", "20", "--size", "1MiB"));
    ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true);
    builder.environment().put("GPUMEMD_TARGET", daemon.unixTarget()); // the default target
    Process process = builder.start();
    List<String> lines = new ArrayList<>();
    try (BufferedReader in = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
      String line;
      while ((line = in.readLine()) != null) {
        lines.add(line);
        if (line.contains(" worker: iteration 3:")) {
          process.toHandle().destroy(); // SIGTERM; Process.destroy would also close our end of stdout
        }
      }
      assertTrue(process.waitFor(30, TimeUnit.SECONDS), "worker did not exit");
    } finally {
      process.destroyForcibly();
    }
    String output = String.join("\n", lines);
    assertEquals(0, process.exitValue(), output);
    assertTrue(output.contains("(signal)"), output);
    assertTrue(lines.stream().noneMatch(l -> l.contains("WARN") || l.contains("ERROR")), output);
    assertEquals(0, stats(0).get(PoolMetric.ACTIVE_LEASES));
    assertEquals(0, daemon.server().registry().sessions(Caller.DAEMON).size(), "the worker closed its session");
  }

  @Test
  void realProcess_exitCodes() throws Exception {
    List<String> ok = DaemonProcess.javaCommand(GpuMemCtl.class.getName());
    ok.addAll(List.of("--target", daemon.tcpTarget(), "--json", "stats", "--device", "1"));
    Process stats = new ProcessBuilder(ok).start();
    String statsOut = new String(stats.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    String statsErr = new String(stats.getErrorStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(stats.waitFor(30, TimeUnit.SECONDS));
    assertEquals(0, stats.exitValue(), statsErr);
    assertEquals("", statsErr);
    assertEquals(1, parse(statsOut, GetStatsResponse.newBuilder()).getDevices(0).getDevice());

    List<String> bad = DaemonProcess.javaCommand(GpuMemCtl.class.getName());
    bad.addAll(List.of("--target", daemon.unixTarget(), "stats", "--device", "9"));
    Process refused = new ProcessBuilder(bad).start();
    String err = new String(refused.getErrorStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(refused.waitFor(30, TimeUnit.SECONDS));
    assertEquals(1, refused.exitValue(), err);
    assertTrue(err.startsWith("gpumemctl: INVALID_ARGUMENT: "), err);
  }
}
