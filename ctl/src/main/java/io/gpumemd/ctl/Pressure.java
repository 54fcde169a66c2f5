package io.gpumemd.ctl;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Sizes;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListDevicesRequest;
import io.gpumemd.proto.v1.TrimRequest;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import org.HdrHistogram.Histogram;

/**
 * The load generator's {@code pressure} scenario: memory that a second process keeps in its
 * client cache is what this process's lease needs.
 *
 * <p>The second process (the <i>hoarder</i>: this tool in a hidden mode) leases a block and
 * closes it, so its client keeps it cached. This process fills the rest of the device's budget
 * with a held lease, then leases the hoarded size over the stream with its own client cache
 * off: only the hoarder's block can make room, so the daemon asks the hoarder to give it back
 * ({@code ReturnCache}) and the lease waits for that. Each round's lease latency is one sample;
 * the target is one round trip plus 10 ms. Needs a device no one else is using.
 */
final class Pressure {
  /** Hoard and filler are whole segment granules: together they fill the budget exactly. */
  private static final long GRANULE = SizeClasses.SEGMENT_GRANULE;

  private Pressure() {}

  static LoadResult run(GpuMemCtl ctl, int device, int rounds, GpuMemClient client, PrintStream err)
      throws IOException, InterruptedException {
    AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(client.connection().channel());
    long limit = admin.listDevices(ListDevicesRequest.getDefaultInstance()).getDevices(device).getLimitBytes();
    Map<String, Object> details = new LinkedHashMap<>();
    Histogram histogram = LoadDriver.newHistogram();
    List<String> command = new ArrayList<>();
    command.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    command.addAll(List.of("-Xmx256m", "-XX:+UseSerialGC", "-cp", System.getProperty("java.class.path"),
        GpuMemCtl.class.getName()));
    command.addAll(ctl.connectionFlags());
    command.addAll(List.of("loadgen", "--hoarder", "--device", Integer.toString(device)));
    Process hoarder = new ProcessBuilder(command).redirectErrorStream(true).start();
    try (BufferedReader fromHoarder = new BufferedReader(new InputStreamReader(hoarder.getInputStream(), StandardCharsets.UTF_8));
         PrintWriter toHoarder = new PrintWriter(hoarder.getOutputStream(), true, StandardCharsets.UTF_8)) {
      long allowance = Long.parseLong(await(fromHoarder, "READY")[1]);
      long hoard = Math.min(allowance, limit / 2) / GRANULE * GRANULE;
      String label = "lease needing another process's cached " + Sizes.label(Math.max(hoard, 0));
      details.put("hoardBytes", hoard);
      details.put("rounds", rounds);
      if (hoard < GRANULE) {
        return new LoadResult("pressure", label, 0, 0, histogram, -1, 1,
            "the daemon grants a client cache allowance of " + Sizes.format(allowance) + " and a budget of "
                + Sizes.format(limit) + ": no room for a 2 MiB hoard", details);
      }
      admin.trim(TrimRequest.newBuilder().setDevice(device).setKeepBytes(0).build());
      long filler = (limit - hoard) / GRANULE * GRANULE;
      try (Lease fill = client.lease(device, filler)) {
        long nanos = 0;
        for (int round = 0; round < rounds; round++) {
          toHoarder.println("hoard " + hoard);
          long cached = Long.parseLong(await(fromHoarder, "HOARDED")[1]);
          if (cached < hoard) {
            return new LoadResult("pressure", label, histogram.getTotalCount(), nanos, histogram, -1, 1,
                "the hoarder kept " + Sizes.format(cached) + " cached, not " + Sizes.format(hoard), details);
          }
          // The hoarder's client tells the daemon within a millisecond that it cached the block:
          // until the daemon knows, it could not ask for it back.
          awaitStats(admin, device, s -> s.getClientCachedBytes() >= hoard);
          long t0 = System.nanoTime();
          Lease needed = client.lease(device, hoard);
          long t = System.nanoTime() - t0;
          needed.close();
          histogram.recordValue(t);
          nanos += t;
          // The release is a notice: let it land before the hoarder leases again.
          awaitStats(admin, device, s -> s.getLeasedBytes() <= fill.blockBytes());
        }
        return new LoadResult("pressure", label, histogram.getTotalCount(), nanos, histogram, -1, 0, null, details);
      } catch (RuntimeException e) {
        err.println("loadgen: pressure: " + e.getMessage());
        return new LoadResult("pressure", label, histogram.getTotalCount(), 0, histogram, -1, 1,
            LoadDriver.describe(e), details);
      }
    } finally {
      hoarder.destroy();
      if (!hoarder.waitFor(10, TimeUnit.SECONDS)) {
        hoarder.destroyForcibly();
      }
    }
  }

  /** Polls the device's stats until {@code done} holds, for at most 5 s. */
  private static void awaitStats(AdminGrpc.AdminBlockingStub admin, int device, Predicate<DeviceStats> done)
      throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (System.nanoTime() < deadline
        && !done.test(admin.getStats(GetStatsRequest.newBuilder().setDevice(device).build()).getDevices(0))) {
      Thread.sleep(1);
    }
  }

  private static String[] await(BufferedReader from, String prefix) throws IOException {
    StringBuilder seen = new StringBuilder();
    String line;
    while ((line = from.readLine()) != null) {
      if (line.startsWith(prefix + " ")) {
        return line.split(" ");
      }
      seen.append(line).append('\n');
    }
    throw new IOException("the hoarder process ended before " + prefix + ": " + seen.toString().strip());
  }

  /**
   * The hoarder: prints {@code READY <allowance>}, then for each {@code hoard <bytes>} line
   * leases that much and closes it into its client cache, answering {@code HOARDED <cached
   * bytes>}; its client gives the blocks back when the daemon asks. Ends when stdin closes.
   */
  static int runHoarder(GpuMemCtl ctl, int device, InputStream in, PrintStream out) {
    try (GpuMemClient client = ctl.connect("gpumemctl-loadgen-hoarder")) {
      out.println("READY " + client.stats().allowanceBytes());
      out.flush();
      BufferedReader commands = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
      String line;
      while ((line = commands.readLine()) != null) {
        if (line.startsWith("hoard ")) {
          client.lease(device, Long.parseLong(line.substring(6))).close();
          out.println("HOARDED " + client.stats().cachedBytes());
          out.flush();
        }
      }
      return 0;
    } catch (IOException e) {
      return 1;
    }
  }
}
