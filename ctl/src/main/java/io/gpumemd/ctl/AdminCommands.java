package io.gpumemd.ctl;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.MessageOrBuilder;
import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.Channels;
import io.gpumemd.common.Sizes;
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
import io.gpumemd.proto.v1.ListObjectsRequest;
import io.gpumemd.proto.v1.ListObjectsResponse;
import io.gpumemd.proto.v1.ObjectInfo;
import io.gpumemd.proto.v1.RemoveObjectRequest;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.RemoveShareRequest;
import io.gpumemd.proto.v1.RevokeShareResponse;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.proto.v1.UnpublishResponse;
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
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;
import java.util.function.ToLongFunction;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

/**
 * The operator commands: one Admin (or health) call each, printed as an aligned table or, with
 * {@code --json}, as the response message in the protobuf JSON mapping (lowerCamelCase names,
 * 64-bit integers as strings, zero values included so that scripts find every field).
 *
 * <p>Each command is a picocli {@code @Command} nested here ({@link Devices}, {@link Stats},
 * {@link Leases}, {@link Sessions}, {@link Objects} with {@link RemoveObject}, {@link Shares}, {@link
 * RevokeShare}, {@link Trim},
 * {@link SetCap}, {@link Health}); it opens an
 * {@code AdminCommands} (one connection), makes its call and closes it. Not thread-safe (one
 * command per instance).
 */
final class AdminCommands implements AutoCloseable {
  /** Admin calls are quick; a daemon that does not answer in this time is reported. */
  private static final long DEADLINE_SECONDS = 10;
  private static final JsonFormat.Printer JSON = JsonFormat.printer().includingDefaultValueFields();

  private final Channels.Connection connection;
  private final AdminGrpc.AdminBlockingStub admin;
  private final boolean json;
  private final PrintStream out;

  private AdminCommands(GpuMemCtl ctl) {
    this.connection = ctl.open();
    this.admin = AdminGrpc.newBlockingStub(connection.channel());
    this.json = ctl.json();
    this.out = ctl.out();
  }

  private AdminGrpc.AdminBlockingStub admin() {
    return admin.withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS);
  }

  // ---------------------------------------------------------------------------- the commands

  /** The options every admin command shares: the device filter. */
  static final class DeviceFilter {
    /** Any integer: whether the ordinal exists is the daemon's to say (INVALID_ARGUMENT). */
    @Option(names = "--device", paramLabel = "N", description = "only this device (default: all)")
    Integer device;

    String where() {
      return device == null ? "all devices" : "device " + device;
    }
  }

  @Command(name = "devices", description = "devices with backend, capacity, budget, cap")
  static final class Devices implements Callable<Integer> {
    private final GpuMemCtl ctl;

    Devices(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.devices();
      }
    }
  }

  @Command(name = "stats", description = "pool counters and gauges per device")
  static final class Stats implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Mixin
    DeviceFilter filter = new DeviceFilter();

    Stats(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.stats(filter.device);
      }
    }
  }

  @Command(name = "leases", description = "live leases, oldest first")
  static final class Leases implements Callable<Integer>, GpuMemCtl.Validated {
    private final GpuMemCtl ctl;
    @Mixin
    DeviceFilter filter = new DeviceFilter();
    @Option(names = "--session", paramLabel = "ID", description = "only this session's leases")
    String session = "";
    @Option(names = "--limit", paramLabel = "N", description = "at most N leases (0: all of them, page by page)")
    int limit;

    Leases(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public void validate(GpuMemCtl.Problems problems) {
      if (limit < 0) {
        problems.add("--limit", limit, "an integer in [0, " + Integer.MAX_VALUE + "]");
      }
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.leases(filter.device, session, limit);
      }
    }
  }

  @Command(name = "sessions", description = "live sessions with what they hold")
  static final class Sessions implements Callable<Integer> {
    private final GpuMemCtl ctl;

    Sessions(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.sessions();
      }
    }
  }

  @Command(name = "objects", description = "published objects with size, holders and age; 'objects rm NAME' removes one")
  static final class Objects implements Callable<Integer> {
    private final GpuMemCtl ctl;

    Objects(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.objects();
      }
    }
  }

  @Command(name = "rm", description = "unpublish an object (its block returns once its last hold is gone)")
  static final class RemoveObject implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Parameters(index = "0", paramLabel = "NAME", description = "the published name")
    String name;
    @Option(names = "--tenant", paramLabel = "T",
        description = "the object's tenant (default: the caller's own; another's needs an admin identity)")
    String tenant = "";

    RemoveObject(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.removeObject(tenant, name);
      }
    }
  }

  @Command(name = "shares", description = "live share tokens (by id, never the token) with tenant, maker, uses and "
      + "expiry; every tenant's for an admin")
  static final class Shares implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Option(names = "--tenant", paramLabel = "T",
        description = "only this tenant's tokens (another tenant's needs an admin identity)")
    String tenant = "";

    Shares(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.shares(tenant);
      }
    }
  }

  @Command(name = "revoke-share", description = "revoke a share token by its id from 'shares' (its own hold ends; "
      + "holds taken with it stay)")
  static final class RevokeShare implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Parameters(index = "0", paramLabel = "SHARE_ID", description = "the token's id, as 'shares' lists it")
    String shareId;
    @Option(names = "--tenant", paramLabel = "T",
        description = "the token's tenant (default: the caller's own; another's needs an admin identity)")
    String tenant = "";

    RevokeShare(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.revokeShare(tenant, shareId);
      }
    }
  }

  @Command(name = "trim", description = "free cached memory down to SIZE per device")
  static final class Trim implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Mixin
    DeviceFilter filter = new DeviceFilter();
    @Option(names = "--keep-bytes", paramLabel = "SIZE", required = true, converter = Converters.Size.class,
        description = "cached bytes to keep per device (0 frees every cached segment)")
    long keepBytes;

    Trim(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.trim(filter, keepBytes);
      }
    }
  }

  @Command(name = "set-cap", description = "set the retention cap (0 disables caching)")
  static final class SetCap implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Mixin
    DeviceFilter filter = new DeviceFilter();
    @Option(names = "--cap-bytes", paramLabel = "SIZE", required = true, converter = Converters.Size.class,
        description = "the most cached free memory to keep per device; lowering it evicts at once")
    long capBytes;

    SetCap(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.setCap(filter, capBytes);
      }
    }
  }

  @Command(name = "health", description = "grpc.health.v1 check; exit 0 if SERVING, else 1")
  static final class Health implements Callable<Integer> {
    private final GpuMemCtl ctl;
    @Option(names = "--service", paramLabel = "NAME",
        description = "the service to check, e.g. gpumemd.v1.Allocator (default: the whole server)")
    String service = "";

    Health(GpuMemCtl ctl) {
      this.ctl = ctl;
    }

    @Override
    public Integer call() {
      try (AdminCommands admin = new AdminCommands(ctl)) {
        return admin.health(service);
      }
    }
  }

  // ---------------------------------------------------------------------------- the calls

  private int devices() {
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

  private int stats(Integer device) {
    GetStatsRequest.Builder request = GetStatsRequest.newBuilder();
    if (device != null) {
      request.setDevice(device);
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
    // hit rate first: the one number an operator looks for; a lease a client served from its
    // own cache is a hit the daemon never saw, so it counts here too
    Object[] hitRate = new Object[columns.length];
    hitRate[0] = "hit rate";
    for (int i = 0; i < devices.size(); i++) {
      DeviceStats d = devices.get(i);
      // in double: clients' reported hits may be saturated at Long.MAX_VALUE, and a long sum would wrap
      double hits = (double) d.getHits() + d.getClientCacheHits();
      double leases = hits + d.getMisses();
      hitRate[i + 1] = leases == 0 ? "-" : String.format(Locale.ROOT, "%.1f%%", 100.0 * hits / leases);
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

  /** Pages asked of the daemon: its default page size, well within a message's bounds. */
  private static final int PAGE_SIZE = 1000;

  /**
   * Every matching lease (at most {@code limit}, 0 = all), following the daemon's pages, as one
   * response: the leases in order and the total as the first page counted it.
   */
  private int leases(Integer device, String session, int limit) {
    ListLeasesResponse.Builder all = ListLeasesResponse.newBuilder();
    String token = "";
    do {
      int want = limit == 0 ? PAGE_SIZE : Math.min(PAGE_SIZE, limit - all.getLeasesCount());
      ListLeasesRequest.Builder request = ListLeasesRequest.newBuilder().setSessionId(session).setPageSize(want)
          .setPageToken(token);
      if (device != null) {
        request.setDevice(device);
      }
      ListLeasesResponse page = admin().listLeases(request.build());
      if (token.isEmpty()) {
        all.setTotal(page.getTotal());
      }
      all.addAllLeases(page.getLeasesList());
      token = page.getNextPageToken();
    } while (!token.isEmpty() && (limit == 0 || all.getLeasesCount() < limit));
    ListLeasesResponse response = all.build();
    if (json) {
      return printJson(response);
    }
    if (response.getLeasesCount() == 0) {
      out.println("no live leases");
      return 0;
    }
    Table table = new Table("LEASE", "SESSION", "CLIENT", ">DEVICE", ">SIZE", ">BLOCK", "TAG", ">AGE", ">SEGMENT", ">OFFSET",
        ">HOLDS", "SHARING");
    for (LeaseInfo l : response.getLeasesList()) {
      table.row(l.getLeaseId(), l.getSessionId(), l.getClientName(), l.getDevice(), Sizes.format(l.getSizeBytes()),
          Sizes.format(l.getBlockBytes()), l.getTag().isEmpty() ? "-" : l.getTag(), Sizes.formatMillis(l.getAgeMs()),
          Long.toUnsignedString(l.getSegmentId()), l.getOffset(), l.getHolds(), sharing(l));
    }
    table.print(out);
    if (response.getTotal() > response.getLeasesCount()) {
      out.println("(" + response.getLeasesCount() + " of " + response.getTotal() + " leases; --limit 0 shows all)");
    }
    return 0;
  }

  /**
   * How a lease takes part in sharing: "attached" for a hold taken by Attach or Lookup, "shared"
   * for a lease whose block others hold too, "ro" for a read-only hold, and the name the block
   * is published under; "-" for a lease nobody shares.
   */
  static String sharing(LeaseInfo l) {
    List<String> parts = new java.util.ArrayList<>(3);
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

  /** Every published object the caller may see, following the daemon's pages, as one response. */
  private int objects() {
    ListObjectsResponse.Builder all = ListObjectsResponse.newBuilder();
    String token = "";
    do {
      ListObjectsResponse page = admin().listObjects(ListObjectsRequest.newBuilder().setPageSize(PAGE_SIZE)
          .setPageToken(token).build());
      if (token.isEmpty()) {
        all.setTotal(page.getTotal());
      }
      all.addAllObjects(page.getObjectsList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    ListObjectsResponse response = all.build();
    if (json) {
      return printJson(response);
    }
    if (response.getObjectsCount() == 0) {
      out.println("no published objects");
      return 0;
    }
    Table table = new Table("NAME", "TENANT", ">DEVICE", ">SIZE", ">HOLDS", ">HOLDERS", ">AGE", "RO");
    for (ObjectInfo o : response.getObjectsList()) {
      table.row(o.getName(), o.getTenant(), o.getDevice(), Sizes.format(o.getSizeBytes()), o.getHolds(), o.getHolders(),
          Sizes.formatMillis(o.getAgeMs()), o.getReadOnly() ? "yes" : "no");
    }
    table.print(out);
    return 0;
  }

  private int removeObject(String tenant, String name) {
    UnpublishResponse response = admin().removeObject(RemoveObjectRequest.newBuilder().setTenant(tenant).setName(name)
        .build());
    if (json) {
      return printJson(response);
    }
    out.println("removed object '" + name + "'" + (tenant.isEmpty() ? "" : " of tenant " + tenant)
        + (response.getBlockReturned() ? "; its block went back to the pool"
            : "; its block stays leased until its other holders release it"));
    return 0;
  }

  /** Every share token the caller may see (of {@code tenant}, when named), following the daemon's pages. */
  private int shares(String tenant) {
    ListSharesResponse.Builder all = ListSharesResponse.newBuilder();
    String token = "";
    do {
      ListSharesResponse page = admin().listShares(ListSharesRequest.newBuilder().setTenant(tenant)
          .setPageSize(PAGE_SIZE).setPageToken(token).build());
      if (token.isEmpty()) {
        all.setTotal(page.getTotal());
      }
      all.addAllShares(page.getSharesList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    ListSharesResponse response = all.build();
    if (json) {
      return printJson(response);
    }
    if (response.getSharesCount() == 0) {
      out.println("no live share tokens");
      return 0;
    }
    Table table = new Table("SHARE ID", "TENANT", "SESSION", "CLIENT", "LEASE", ">DEVICE", ">SIZE", ">HOLDS",
        ">ATTACHES", ">EXPIRES IN", "RO");
    for (ShareInfo h : response.getSharesList()) {
      table.row(h.getShareId(), h.getTenant(), h.getSessionId(), h.getClientName(), h.getLeaseId(), h.getDevice(),
          Sizes.format(h.getSizeBytes()), h.getHolds(), h.getAttaches() + "/" + (h.getMaxAttaches() == 0 ? "any"
              : Integer.toUnsignedString(h.getMaxAttaches())), Sizes.formatMillis(h.getExpiresInMs()),
          h.getReadOnly() ? "yes" : "no");
    }
    table.print(out);
    return 0;
  }

  private int revokeShare(String tenant, String shareId) {
    RevokeShareResponse response = admin().removeShare(RemoveShareRequest.newBuilder().setTenant(tenant)
        .setShareId(shareId).build());
    if (json) {
      return printJson(response);
    }
    out.println("revoked share token " + shareId + (tenant.isEmpty() ? "" : " of tenant " + tenant)
        + (response.getBlockReturned() ? "; its block went back to the pool"
            : "; its block stays leased until its other holders release it"));
    return 0;
  }

  /** Every session the caller may see, following the daemon's pages, as one response. */
  private int sessions() {
    ListSessionsResponse.Builder all = ListSessionsResponse.newBuilder();
    String token = "";
    do {
      ListSessionsResponse page = admin().listSessions(ListSessionsRequest.newBuilder().setPageSize(PAGE_SIZE)
          .setPageToken(token).build());
      if (token.isEmpty()) {
        all.setTotal(page.getTotal());
      }
      all.addAllSessions(page.getSessionsList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    ListSessionsResponse response = all.build();
    if (json) {
      return printJson(response);
    }
    if (response.getSessionsCount() == 0) {
      out.println("no live sessions");
      return 0;
    }
    Table table = new Table("SESSION", "CLIENT", "TENANT", "PEER", ">LEASES", ">LEASED", ">CLIENT CACHED", ">ALLOWANCE", ">MAPPED SEGMENTS",
        "STREAM", ">TTL", ">AGE");
    for (SessionInfo s : response.getSessionsList()) {
      table.row(s.getSessionId(), s.getClientName(), s.getTenant(), s.getPeer(), s.getLeases(), Sizes.format(s.getLeasedBytes()),
          Sizes.format(s.getClientCachedBytes()), Sizes.format(s.getClientCacheAllowanceBytes()), s.getMappedSegments(), s.getStreamAttached() ? "attached" : "detached", s.getTtlSeconds() + " s",
          Sizes.formatMillis(s.getAgeMs()));
    }
    table.print(out);
    return 0;
  }

  private int trim(DeviceFilter filter, long keepBytes) {
    TrimRequest.Builder request = TrimRequest.newBuilder().setKeepBytes(keepBytes);
    if (filter.device != null) {
      request.setDevice(filter.device);
    }
    TrimResponse response = admin().trim(request.build());
    if (json) {
      return printJson(response);
    }
    out.println("freed " + Sizes.format(response.getFreedBytes()) + " (" + response.getFreedBytes() + " bytes) on "
        + filter.where() + ", keeping at most " + Sizes.format(request.getKeepBytes()) + " cached per device");
    return 0;
  }

  private int setCap(DeviceFilter filter, long capBytes) {
    SetRetentionCapRequest.Builder request = SetRetentionCapRequest.newBuilder().setCapBytes(capBytes);
    if (filter.device != null) {
      request.setDevice(filter.device);
    }
    SetRetentionCapResponse response = admin().setRetentionCap(request.build());
    if (json) {
      return printJson(response);
    }
    out.println("retention cap set to " + Sizes.format(request.getCapBytes()) + " on " + filter.where() + ": evicted "
        + Sizes.format(response.getEvictedBytes()) + " (" + response.getEvictedBytes() + " bytes)");
    return 0;
  }

  private int health(String service) {
    HealthCheckResponse response = HealthGrpc.newBlockingStub(connection.channel())
        .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
        .check(HealthCheckRequest.newBuilder().setService(service).build());
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
