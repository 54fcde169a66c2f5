package io.gpumemd.ctl;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.MessageOrBuilder;
import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
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
import io.gpumemd.proto.v1.SetRetentionCapRequest;
import io.gpumemd.proto.v1.SetRetentionCapResponse;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.proto.v1.TrimResponse;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.io.PrintStream;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.function.ToLongFunction;

/**
 * The operator commands: one Admin (or health) call each, printed as an aligned table or, with
 * {@code --json}, as the response message in the protobuf JSON mapping (lowerCamelCase names,
 * 64-bit integers as strings, zero values included so that scripts find every field).
 *
 * <p>Owns its connection; close it when done. Not thread-safe (one command per instance).
 */
final class AdminCommands implements AutoCloseable {
  /** Admin calls are quick; a daemon that does not answer in this time is reported. */
  private static final long DEADLINE_SECONDS = 10;
  private static final JsonFormat.Printer JSON = JsonFormat.printer().includingDefaultValueFields();

  private final Channels.Connection connection;
  private final AdminGrpc.AdminBlockingStub admin;
  private final boolean json;
  private final PrintStream out;

  private AdminCommands(Channels.Connection connection, boolean json, PrintStream out) {
    this.connection = connection;
    this.admin = AdminGrpc.newBlockingStub(connection.channel());
    this.json = json;
    this.out = out;
  }

  static AdminCommands connect(String target, boolean json, PrintStream out) {
    return new AdminCommands(GpuMemCtl.open(target), json, out);
  }

  private AdminGrpc.AdminBlockingStub admin() {
    return admin.withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS);
  }

  /** Runs {@code command}; returns the exit code. */
  int run(String command, CommandLine cli) {
    return switch (command) {
      case "devices" -> devices(cli.allow(GpuMemCtl.GLOBAL_FLAGS));
      case "stats" -> stats(cli.allow(GpuMemCtl.GLOBAL_FLAGS, "device"));
      case "leases" -> leases(cli.allow(GpuMemCtl.GLOBAL_FLAGS, "device", "session", "limit"));
      case "sessions" -> sessions(cli.allow(GpuMemCtl.GLOBAL_FLAGS));
      case "trim" -> trim(cli.allow(GpuMemCtl.GLOBAL_FLAGS, "device", "keep-bytes"));
      case "set-cap" -> setCap(cli.allow(GpuMemCtl.GLOBAL_FLAGS, "device", "cap-bytes"));
      case "health" -> health(cli.allow(GpuMemCtl.GLOBAL_FLAGS, "service"));
      default -> throw new IllegalArgumentException(command);
    };
  }

  private static boolean hasDevice(CommandLine cli) {
    return cli.has("device");
  }

  /** Any integer: whether the ordinal exists is the daemon's to say (INVALID_ARGUMENT). */
  private static int device(CommandLine cli) {
    return cli.integer("device", 0, Integer.MIN_VALUE, Integer.MAX_VALUE);
  }

  private int devices(CommandLine cli) {
    ListDevicesResponse response = admin().listDevices(ListDevicesRequest.getDefaultInstance());
    if (json) {
      return printJson(response);
    }
    Table table = new Table(">DEVICE", "NAME", "BACKEND", ">CAPACITY", ">LIMIT", ">RETENTION CAP", ">FREE AT START", "UUID");
    for (DeviceInfo d : response.getDevicesList()) {
      table.row(d.getDevice(), d.getName(), d.getBackend(), Sizes.format(d.getCapacityBytes()),
          Sizes.format(d.getLimitBytes()), Sizes.format(d.getRetentionCapBytes()),
          Sizes.format(d.getFreeBytesAtStart()), d.getUuid());
    }
    table.print(out);
    return 0;
  }

  /** Stats as rows of counters, one column per device. */
  private record Row(String name, boolean bytes, ToLongFunction<DeviceStats> value) {}

  private static final List<Row> STATS_ROWS = List.of(
      new Row("hits", false, DeviceStats::getHits),
      new Row("misses", false, DeviceStats::getMisses),
      new Row("returns", false, DeviceStats::getReturns),
      new Row("evictions", false, DeviceStats::getEvictions),
      new Row("alloc retries", false, DeviceStats::getAllocRetries),
      new Row("ooms", false, DeviceStats::getOoms),
      new Row("active leases", false, DeviceStats::getActiveLeases),
      new Row("leased", true, DeviceStats::getLeasedBytes),
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
      new Row("retention cap", true, DeviceStats::getRetentionCapBytes),
      new Row("limit", true, DeviceStats::getLimitBytes),
      new Row("capacity", true, DeviceStats::getCapacityBytes));

  private int stats(CommandLine cli) {
    GetStatsRequest.Builder request = GetStatsRequest.newBuilder();
    if (hasDevice(cli)) {
      request.setDevice(device(cli));
    }
    GetStatsResponse response = admin().getStats(request.build());
    if (json) {
      return printJson(response);
    }
    List<DeviceStats> devices = response.getDevicesList();
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
      DeviceStats d = devices.get(i);
      long leases = d.getHits() + d.getMisses();
      hitRate[i + 1] = leases == 0 ? "-" : String.format(Locale.ROOT, "%.1f%%", 100.0 * d.getHits() / leases);
    }
    table.row(hitRate);
    for (Row row : STATS_ROWS) {
      Object[] cells = new Object[columns.length];
      cells[0] = row.name();
      for (int i = 0; i < devices.size(); i++) {
        long v = row.value().applyAsLong(devices.get(i));
        cells[i + 1] = row.bytes() ? Sizes.format(v) : Long.toString(v);
      }
      table.row(cells);
    }
    table.print(out);
    return 0;
  }

  private int leases(CommandLine cli) {
    ListLeasesRequest.Builder request = ListLeasesRequest.newBuilder().setSessionId(cli.string("session", ""))
        .setLimit(cli.integer("limit", 0, 0, Integer.MAX_VALUE));
    if (hasDevice(cli)) {
      request.setDevice(device(cli));
    }
    ListLeasesResponse response = admin().listLeases(request.build());
    if (json) {
      return printJson(response);
    }
    if (response.getLeasesCount() == 0) {
      out.println("no live leases");
      return 0;
    }
    Table table = new Table("LEASE", "SESSION", "CLIENT", ">DEVICE", ">SIZE", ">BLOCK", "TAG", ">AGE", ">SEGMENT", ">OFFSET");
    for (LeaseInfo l : response.getLeasesList()) {
      table.row(l.getLeaseId(), l.getSessionId(), l.getClientName(), l.getDevice(), Sizes.format(l.getSizeBytes()),
          Sizes.format(l.getBlockBytes()), l.getTag().isEmpty() ? "-" : l.getTag(), Sizes.formatMillis(l.getAgeMs()),
          Long.toUnsignedString(l.getSegmentId()), l.getOffset());
    }
    table.print(out);
    if (response.getTotal() > response.getLeasesCount()) {
      out.println("(" + response.getLeasesCount() + " of " + response.getTotal() + " leases; --limit N shows more)");
    }
    return 0;
  }

  private int sessions(CommandLine cli) {
    ListSessionsResponse response = admin().listSessions(ListSessionsRequest.getDefaultInstance());
    if (json) {
      return printJson(response);
    }
    if (response.getSessionsCount() == 0) {
      out.println("no live sessions");
      return 0;
    }
    Table table = new Table("SESSION", "CLIENT", ">LEASES", ">LEASED", ">MAPPED SEGMENTS", "STREAM", ">TTL", ">AGE");
    for (SessionInfo s : response.getSessionsList()) {
      table.row(s.getSessionId(), s.getClientName(), s.getLeases(), Sizes.format(s.getLeasedBytes()),
          s.getMappedSegments(), s.getStreamAttached() ? "attached" : "detached", s.getTtlSeconds() + " s",
          Sizes.formatMillis(s.getAgeMs()));
    }
    table.print(out);
    return 0;
  }

  private int trim(CommandLine cli) {
    TrimRequest.Builder request = TrimRequest.newBuilder().setKeepBytes(cli.requiredSize("keep-bytes"));
    if (hasDevice(cli)) {
      request.setDevice(device(cli));
    }
    TrimResponse response = admin().trim(request.build());
    if (json) {
      return printJson(response);
    }
    out.println("freed " + Sizes.format(response.getFreedBytes()) + " (" + response.getFreedBytes() + " bytes) on "
        + where(cli) + ", keeping at most " + Sizes.format(request.getKeepBytes()) + " cached per device");
    return 0;
  }

  private int setCap(CommandLine cli) {
    SetRetentionCapRequest.Builder request = SetRetentionCapRequest.newBuilder().setCapBytes(cli.requiredSize("cap-bytes"));
    if (hasDevice(cli)) {
      request.setDevice(device(cli));
    }
    SetRetentionCapResponse response = admin().setRetentionCap(request.build());
    if (json) {
      return printJson(response);
    }
    out.println("retention cap set to " + Sizes.format(request.getCapBytes()) + " on " + where(cli) + ": evicted "
        + Sizes.format(response.getEvictedBytes()) + " (" + response.getEvictedBytes() + " bytes)");
    return 0;
  }

  private static String where(CommandLine cli) {
    return hasDevice(cli) ? "device " + device(cli) : "all devices";
  }

  private int health(CommandLine cli) {
    HealthCheckResponse response = HealthGrpc.newBlockingStub(connection.channel())
        .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
        .check(HealthCheckRequest.newBuilder().setService(cli.string("service", "")).build());
    if (json) {
      printJson(response);
    } else {
      out.println(response.getStatus());
    }
    return response.getStatus() == HealthCheckResponse.ServingStatus.SERVING ? 0 : 1;
  }

  private int printJson(MessageOrBuilder message) {
    try {
      out.println(JSON.print(message));
    } catch (InvalidProtocolBufferException e) {
      throw new IllegalStateException("cannot print " + message.getClass().getSimpleName() + " as JSON", e);
    }
    return 0;
  }

  @Override
  public void close() {
    connection.close();
  }
}
