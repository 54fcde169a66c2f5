package io.gpumemd.ctl;

import io.gpumemd.common.Sizes;
import io.gpumemd.proto.v1.DeviceInfo;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.GetStatsResponse;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListDevicesRequest;
import io.gpumemd.proto.v1.ListDevicesResponse;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListLeasesResponse;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.proto.v1.SessionInfo;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.function.ToLongFunction;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/**
 * The commands that show what the daemon holds, changing nothing: {@link Devices}, {@link Stats},
 * {@link Leases} and {@link Sessions}, each an {@link AdminCommand} with its table. Not
 * thread-safe (one command per instance).
 */
final class ListingCommands {
  private ListingCommands() {}

  @Command(name = "devices", description = "devices with backend, capacity, budget, cap")
  static final class Devices extends AdminCommand {
    Devices(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      ListDevicesResponse response = admin.admin().listDevices(ListDevicesRequest.getDefaultInstance());
      return admin.print(response, out -> {
        Table table = new Table(">DEVICE", "NAME", "BACKEND", ">CAPACITY", ">LIMIT", ">RETENTION CAP", ">FREE AT START",
            "UUID");
        for (DeviceInfo d : response.getDevicesList()) {
          table.row(d.getDevice(), d.getName(), d.getBackend(), Sizes.format(d.getCapacityBytes()),
              Sizes.format(d.getLimitBytes()), Sizes.format(d.getRetentionCapBytes()),
              Sizes.format(d.getFreeBytesAtStart()), d.getUuid());
        }
        table.print(out);
      });
    }
  }

  @Command(name = "stats", description = "pool counters and gauges per device")
  static final class Stats extends AdminCommand {
    /** Stats as rows of counters, one column per device. */
    private record Row(String name, boolean bytes, ToLongFunction<DeviceStats> value) {}

    private static final List<Row> ROWS = List.of(
        new Row("hits", false, DeviceStats::getHits),
        new Row("misses", false, DeviceStats::getMisses),
        new Row("returns", false, DeviceStats::getReturns),
        new Row("evictions", false, DeviceStats::getEvictions),
        new Row("alloc retries", false, DeviceStats::getAllocRetries),
        new Row("ooms", false, DeviceStats::getOoms),
        new Row("active leases", false, DeviceStats::getActiveLeases),
        new Row("client cache hits", false, DeviceStats::getClientCacheHits),
        new Row("client cache returns", false, DeviceStats::getClientCacheReturns),
        new Row("leased", true, DeviceStats::getLeasedBytes),
        new Row("client cached", true, DeviceStats::getClientCachedBytes),
        new Row("peak leased", true, DeviceStats::getPeakLeasedBytes),
        new Row("cached", true, DeviceStats::getCachedBytes),
        new Row("cached blocks", false, DeviceStats::getCachedBlocks),
        new Row("split remainders", true, DeviceStats::getRemainderBytes),
        new Row("reserved", true, DeviceStats::getReservedBytes),
        new Row("segments", false, DeviceStats::getSegments),
        new Row("segments awaiting unmap", false, DeviceStats::getSegmentsAwaitingUnmap),
        new Row("blocks awaiting event", false, DeviceStats::getBlocksAwaitingEvent),
        new Row("backend allocs", false, DeviceStats::getBackendAllocs),
        new Row("backend frees", false, DeviceStats::getBackendFrees),
        new Row("scrubbed", true, DeviceStats::getScrubbedBytes),
        new Row("shares", false, DeviceStats::getShares),
        new Row("attaches", false, DeviceStats::getAttaches),
        new Row("live holds", false, DeviceStats::getLiveHolds),
        new Row("shared blocks", false, DeviceStats::getSharedBlocks),
        new Row("published objects", false, DeviceStats::getPublishedObjects),
        new Row("published", true, DeviceStats::getPublishedBytes),
        new Row("published limit", true, DeviceStats::getPublishedLimitBytes),
        new Row("retention cap", true, DeviceStats::getRetentionCapBytes),
        new Row("limit", true, DeviceStats::getLimitBytes),
        new Row("capacity", true, DeviceStats::getCapacityBytes));

    @Mixin
    DeviceFilter filter = new DeviceFilter();

    Stats(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      GetStatsRequest.Builder request = GetStatsRequest.newBuilder();
      filter.applyTo(request::setDevice);
      GetStatsResponse response = admin.admin().getStats(request.build());
      return admin.print(response, out -> print(response.getDevicesList(), out));
    }

    private static void print(List<DeviceStats> devices, PrintStream out) {
      String[] columns = new String[devices.size() + 1];
      columns[0] = "";
      for (int i = 0; i < devices.size(); i++) {
        columns[i + 1] = ">DEVICE " + devices.get(i).getDevice();
      }
      Table table = new Table(columns);
      // hit rate first: the one number an operator looks for
      Object[] hitRate = new Object[columns.length];
      hitRate[0] = "hit rate";
      for (int i = 0; i < devices.size(); i++) {
        hitRate[i + 1] = hitRate(devices.get(i));
      }
      table.row(hitRate);
      for (Row row : ROWS) {
        Object[] cells = new Object[columns.length];
        cells[0] = row.name();
        for (int i = 0; i < devices.size(); i++) {
          long v = row.value().applyAsLong(devices.get(i));
          cells[i + 1] = row.bytes() ? Sizes.format(v) : Long.toString(v);
        }
        table.row(cells);
      }
      table.print(out);
    }

    /**
     * The share of leases served from a cache, "-" before the first: a lease a client served
     * from its own cache is a hit the daemon never saw, so it counts here too.
     */
    private static String hitRate(DeviceStats d) {
      // in double: clients' reported hits may be saturated at Long.MAX_VALUE, and a long sum would wrap
      double hits = (double) d.getHits() + d.getClientCacheHits();
      double leases = hits + d.getMisses();
      return leases == 0 ? "-" : String.format(Locale.ROOT, "%.1f%%", 100.0 * hits / leases);
    }
  }

  @Command(name = "leases", description = "live leases, oldest first")
  static final class Leases extends AdminCommand implements GpuMemCtl.Validated {
    @Mixin
    DeviceFilter filter = new DeviceFilter();
    @Option(names = "--session", paramLabel = "ID", description = "only this session's leases")
    String session = "";
    @Option(names = "--limit", paramLabel = "N", description = "at most N leases (0: all of them, page by page)")
    int limit;

    Leases(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    public void validate(GpuMemCtl.Problems problems) {
      if (limit < 0) {
        problems.add("--limit", limit, "an integer in [0, " + Integer.MAX_VALUE + "]");
      }
    }

    /** Every matching lease (at most {@code --limit}), as one response. */
    @Override
    int run(AdminConnection admin) {
      AdminConnection.Page<LeaseInfo> all = AdminConnection.pages(limit, (pageSize, token) -> {
        ListLeasesRequest.Builder request = ListLeasesRequest.newBuilder().setSessionId(session).setPageSize(pageSize)
            .setPageToken(token);
        filter.applyTo(request::setDevice);
        ListLeasesResponse page = admin.admin().listLeases(request.build());
        return new AdminConnection.Page<>(page.getLeasesList(), page.getTotal(), page.getNextPageToken());
      });
      ListLeasesResponse response = ListLeasesResponse.newBuilder().setTotal(all.total()).addAllLeases(all.items())
          .build();
      return admin.print(response, out -> print(response, out));
    }

    private static void print(ListLeasesResponse response, PrintStream out) {
      if (response.getLeasesCount() == 0) {
        out.println("no live leases");
        return;
      }
      Table table = new Table("LEASE", "SESSION", "CLIENT", ">DEVICE", ">SIZE", ">BLOCK", "TAG", ">AGE", "SLEEP",
          ">SEGMENT", ">OFFSET", ">HOLDS", "SHARING");
      for (LeaseInfo l : response.getLeasesList()) {
        table.row(l.getLeaseId(), l.getSessionId(), l.getClientName(), l.getDevice(), Sizes.format(l.getSizeBytes()),
            Sizes.format(l.getBlockBytes()), l.getTag().isEmpty() ? "-" : l.getTag(), Sizes.formatMillis(l.getAgeMs()),
            l.getSleepLevel() == 0 ? "-" : "level " + l.getSleepLevel(), Long.toUnsignedString(l.getSegmentId()),
            l.getOffset(), l.getHolds(), sharing(l));
      }
      table.print(out);
      if (response.getTotal() > response.getLeasesCount()) {
        out.println("(" + response.getLeasesCount() + " of " + response.getTotal() + " leases; --limit 0 shows all)");
      }
    }

    /**
     * How a lease takes part in sharing: "attached" for a hold taken by Attach or Lookup, "shared"
     * for a lease whose block others hold too, "ro" for a read-only hold, and the name the block
     * is published under; "-" for a lease nobody shares.
     */
    static String sharing(LeaseInfo l) {
      List<String> parts = new ArrayList<>(3);
      if (l.getAttached()) {
        parts.add("attached");
      } else if (l.getHolds() > 1 || !l.getObjectName().isEmpty()) {
        parts.add("shared");
      }
      if (l.getReadOnly()) {
        parts.add("ro");
      }
      if (!l.getObjectName().isEmpty()) {
        parts.add("name=" + l.getObjectName());
      }
      return parts.isEmpty() ? "-" : String.join(",", parts);
    }
  }

  @Command(name = "sessions", description = "live sessions with what they hold")
  static final class Sessions extends AdminCommand {
    Sessions(GpuMemCtl ctl) {
      super(ctl);
    }

    /** Every session the caller may see, as one response. */
    @Override
    int run(AdminConnection admin) {
      AdminConnection.Page<SessionInfo> all = AdminConnection.pages(0, (pageSize, token) -> {
        ListSessionsResponse page = admin.admin().listSessions(ListSessionsRequest.newBuilder().setPageSize(pageSize)
            .setPageToken(token).build());
        return new AdminConnection.Page<>(page.getSessionsList(), page.getTotal(), page.getNextPageToken());
      });
      ListSessionsResponse response = ListSessionsResponse.newBuilder().setTotal(all.total())
          .addAllSessions(all.items()).build();
      return admin.print(response, out -> print(response.getSessionsList(), out));
    }

    private static void print(List<SessionInfo> sessions, PrintStream out) {
      if (sessions.isEmpty()) {
        out.println("no live sessions");
        return;
      }
      Table table = new Table("SESSION", "CLIENT", "TENANT", "PEER", ">LEASES", ">LEASED", ">CLIENT CACHED",
          ">ALLOWANCE", ">MAPPED SEGMENTS", "STREAM", ">TTL", ">AGE", ">ASLEEP", ">IN HOST MEMORY");
      for (SessionInfo s : sessions) {
        table.row(s.getSessionId(), s.getClientName(), s.getTenant(), s.getPeer(), s.getLeases(),
            Sizes.format(s.getLeasedBytes()), Sizes.format(s.getClientCachedBytes()),
            Sizes.format(s.getClientCacheAllowanceBytes()), s.getMappedSegments(),
            s.getStreamAttached() ? "attached" : "detached", s.getTtlSeconds() + " s", Sizes.formatMillis(s.getAgeMs()),
            s.getSleepingLeases() == 0 ? "-" : s.getSleepingLeases() + " leases", Sizes.format(s.getHostBytes()));
      }
      table.print(out);
    }
  }
}
