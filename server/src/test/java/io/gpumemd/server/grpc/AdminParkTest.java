package io.gpumemd.server.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListObjectsRequest;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.ObjectInfo;
import io.gpumemd.proto.v1.ParkObjectRequest;
import io.gpumemd.proto.v1.ParkObjectResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.PublishRequest;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.RemoveShareRequest;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.proto.v1.ShareRequest;
import io.gpumemd.proto.v1.ShareResponse;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.sharing.ObjectParking;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;
import org.junit.jupiter.api.io.TempDir;

/**
 * Admin.ParkObject and a Lookup of a parked object through the real services on an in-process
 * transport with a fixed caller per channel: what ListObjects shows, the status of every refusal,
 * and that a refusal changes nothing.
 */
class AdminParkTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000 pid 21", false, 2000, 2000, 21, "pid 21");
  private static final Caller ROOT = new Caller("uid:0", "uid 0 pid 1", true, 0, 0, 1, "pid 1");
  /** The host store's bound (--offload-max-bytes) here: small, so that a test passes it. */
  private static final long HOST_BYTES = 3 * MIB;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private final List<Server> servers = new ArrayList<>();
  private final List<ManagedChannel> channels = new ArrayList<>();

  /** The two services as one caller reaches them. */
  private record Stubs(AllocatorGrpc.AllocatorBlockingStub allocator, AdminGrpc.AdminBlockingStub admin) {}

  private Stubs alice;
  private Stubs bob;
  private Stubs root;

  @BeforeEach
  void start() throws Exception {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(32 * MIB, 32 * MIB, 20 * MIB),
        sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, SessionSettings.defaults().withLimits(SessionLimits.UNLIMITED),
        ticker, sessions, HOST_BYTES);
    alice = stubs(ALICE);
    bob = stubs(BOB);
    root = stubs(ROOT);
  }

  private Stubs stubs(Caller caller) throws Exception {
    String name = InProcessServerBuilder.generateName();
    servers.add(InProcessServerBuilder.forName(name).directExecutor()
        .addService(new AllocatorService(registry, Runnable::run,
            new ServerMetrics(new SimpleMeterRegistry(), pools, registry::sessionCount, backend),
            new StreamWatchdog(StreamWatchdog.DEFAULT_STALL_MILLIS, ticker)))
        .addService(new AdminService(pools, registry, Runnable::run))
        .intercept(Callers.fixed(caller))
        .build().start());
    ManagedChannel channel = InProcessChannelBuilder.forName(name).directExecutor().build();
    channels.add(channel);
    return new Stubs(AllocatorGrpc.newBlockingStub(channel), AdminGrpc.newBlockingStub(channel));
  }

  @AfterEach
  void stop() throws Exception {
    channels.forEach(ManagedChannel::shutdownNow);
    for (Server server : servers) {
      server.shutdownNow();
      assertTrue(server.awaitTermination(5, TimeUnit.SECONDS), "server left running");
    }
    pools.get(0).verifyInvariants();
    pools.close();
    backend.close();
  }

  private static String session(Stubs who, String client) {
    return who.allocator().openSession(OpenSessionRequest.newBuilder().setClientName(client).build()).getSessionId();
  }

  private static LeaseResponse lease(Stubs who, String session, long size) {
    return who.allocator().lease(LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(size)
        .build());
  }

  private static String publish(Stubs who, String session, String lease, String name) {
    who.allocator().publish(PublishRequest.newBuilder().setSessionId(session).setLeaseId(lease).setName(name).build());
    return name;
  }

  private static LeaseResponse lookup(Stubs who, String session, String name) {
    return who.allocator().lookup(LookupRequest.newBuilder().setSessionId(session).setName(name).build()).getLease();
  }

  private static ParkObjectResponse park(Stubs who, String tenant, String name) {
    return who.admin().parkObject(ParkObjectRequest.newBuilder().setTenant(tenant).setName(name).build());
  }

  private static ObjectInfo object(Stubs who, String name) {
    return who.admin().listObjects(ListObjectsRequest.getDefaultInstance()).getObjectsList().stream()
        .filter(o -> o.getName().equals(name)).findFirst().orElseThrow();
  }

  /** Publishes a lease of {@code size} under {@code name} and releases the lease: only the name holds it. */
  private static void publishAndLeave(Stubs who, String name, long size) {
    String loader = session(who, "loader");
    LeaseResponse lease = lease(who, loader, size);
    publish(who, loader, lease.getLeaseId(), name);
    release(who, loader, lease.getLeaseId());
  }

  private static ShareResponse share(Stubs who, String session, String lease, boolean readOnly, int maxAttaches) {
    return who.allocator().share(ShareRequest.newBuilder().setSessionId(session).setLeaseId(lease)
        .setReadOnly(readOnly).setMaxAttaches(maxAttaches).build());
  }

  private static LeaseResponse attach(Stubs who, String session, String token) {
    return who.allocator().attach(AttachRequest.newBuilder().setSessionId(session).setToken(token).build()).getLease();
  }

  private static void release(Stubs who, String session, String lease) {
    who.allocator().release(ReleaseRequest.newBuilder().setSessionId(session).setLeaseId(lease).build());
  }

  private static ListSharesResponse shares(Stubs who, String tenant) {
    return who.admin().listShares(ListSharesRequest.newBuilder().setTenant(tenant).build());
  }

  private static boolean removeShare(Stubs who, String tenant, String shareId) {
    return who.admin().removeShare(RemoveShareRequest.newBuilder().setTenant(tenant).setShareId(shareId).build())
        .getBlockReturned();
  }

  private long leasedBytes() {
    return root.admin().getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).getLeasedBytes();
  }

  /** What a refused call must not change: every tenant's objects, the pool, the leases. */
  private String state() {
    return root.admin().listObjects(ListObjectsRequest.getDefaultInstance()).getObjectsList().stream()
        .map(o -> o.toBuilder().clearAgeMs().build()).toList() + root.admin().getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).toString()
        + root.admin().listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesList();
  }

  private void refused(Status.Code code, String text, Executable call) {
    String before = state();
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, call);
    assertEquals(code, e.getStatus().getCode(), e.getStatus().toString());
    assertTrue(e.getStatus().getDescription().contains(text),
        "message '" + e.getStatus().getDescription() + "' should contain '" + text + "'");
    assertEquals(before, state(), "a refused call changed something");
  }

  @Test
  void park_thenLookup_restoresTheObject_andListObjectsShowsWhereItIs() {
    publishAndLeave(alice, "weights", MIB);
    long blockBytes = object(alice, "weights").getBlockBytes();

    ParkObjectResponse parked = park(alice, "", "weights");

    assertEquals(blockBytes, parked.getHostBytes());
    assertEquals(blockBytes, parked.getFreedBytes());
    assertEquals(0, leasedBytes());
    ObjectInfo listed = object(root, "weights");
    assertTrue(listed.getParked());
    assertEquals(blockBytes, listed.getHostBytes());
    assertEquals(0, park(alice, "", "weights").getFreedBytes(), "parked already");

    String engine = session(alice, "engine");
    LeaseResponse hold = lookup(alice, engine, "weights");

    assertEquals(blockBytes, hold.getBlockBytes());
    assertEquals(blockBytes, leasedBytes());
    assertFalse(object(alice, "weights").getParked());
    assertEquals(0, object(alice, "weights").getHostBytes());
  }

  @Test
  void park_byAnAdmin_reachesAnyTenant_andAnotherTenantIsDenied() {
    publishAndLeave(alice, "weights", MIB);

    refused(Status.Code.PERMISSION_DENIED, "admin", () -> park(bob, "uid:1000", "weights"));
    refused(Status.Code.NOT_FOUND, "'weights'", () -> park(bob, "", "weights"));
    try (LogCapture audit = new LogCapture(ObjectParking.class)) {
      assertTrue(park(root, "uid:1000", "weights").getFreedBytes() > 0);
      String engine = session(alice, "engine");
      lookup(alice, engine, "weights");
      List<String> lines = audit.messages("INFO");
      assertEquals(2, lines.size(), lines.toString());
      assertTrue(lines.get(0).startsWith("Object 'weights' of tenant uid:1000 parked by uid 0 pid 1 (admin): 1.0 MiB "
          + "to host memory"), lines.get(0));
      assertTrue(lines.get(1).startsWith("Object 'weights' of tenant uid:1000 restored for"), lines.get(1));
      assertTrue(lines.get(1).contains(engine.substring(0, 8)) && lines.get(1).contains("1.0 MiB from host memory"),
          lines.get(1));
    }
  }

  @Test
  void park_ofAHeldObject_isFailedPreconditionNamingTheHolder() {
    String loader = session(alice, "loader");
    LeaseResponse lease = lease(alice, loader, MIB);
    publish(alice, loader, lease.getLeaseId(), "weights");

    refused(Status.Code.FAILED_PRECONDITION, loader.substring(0, 8), () -> park(alice, "", "weights"));
    refused(Status.Code.FAILED_PRECONDITION, lease.getLeaseId(), () -> park(alice, "", "weights"));
  }

  @Test
  void park_pastTheHostBound_isResourceExhaustedNamingTheFlag() {
    publishAndLeave(alice, "big", 4 * MIB);

    refused(Status.Code.RESOURCE_EXHAUSTED, "--offload-max-bytes", () -> park(alice, "", "big"));
    assertFalse(object(alice, "big").getParked());
  }
}
