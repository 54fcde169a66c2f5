package io.gpumemd.server.grpc;

import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.common.Ticker;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.error.StatusMapper;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.SetRetentionCapRequest;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.AttachResponse;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListObjectsRequest;
import io.gpumemd.proto.v1.ListObjectsResponse;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.PublishRequest;
import io.gpumemd.proto.v1.RemoveObjectRequest;
import io.gpumemd.proto.v1.RevokeShareRequest;
import io.gpumemd.proto.v1.ShareRequest;
import io.gpumemd.proto.v1.UnpublishRequest;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.testing.FakeTicker;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every row of the README's status table ("The API and its status codes") through the real services on an in-process
 * transport: the precise code, a message a person understands, and nothing changed.
 */
class StatusTableTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private final StreamWatchdog watchdog = new StreamWatchdog(StreamWatchdog.DEFAULT_STALL_MILLIS, ticker);
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private Server server;
  private ManagedChannel channel;
  private AllocatorGrpc.AllocatorBlockingStub allocator;
  private AdminGrpc.AdminBlockingStub admin;

  @BeforeEach
  void start() throws Exception {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(32 * MIB, 32 * MIB, 20 * MIB),
        sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend,
        new SessionSettings(30, 3600, 2000, 0, new Quota(0, 3), Map.of()), ticker, sessions);
    String name = InProcessServerBuilder.generateName();
    server = InProcessServerBuilder.forName(name).directExecutor()
        .addService(new AllocatorService(registry, Runnable::run,
            new ServerMetrics(new SimpleMeterRegistry(), pools, registry::sessionCount, backend), watchdog))
        .addService(new AdminService(pools, registry, Runnable::run))
        // in-process calls identify nobody: they act as the daemon (an admin), as embedded callers do
        .intercept(Callers.fixed(Caller.DAEMON))
        .build().start();
    channel = InProcessChannelBuilder.forName(name).directExecutor().build();
    allocator = AllocatorGrpc.newBlockingStub(channel);
    admin = AdminGrpc.newBlockingStub(channel);
  }

  @AfterEach
  void stop() throws Exception {
    channel.shutdownNow();
    server.shutdownNow();
    assertTrue(server.awaitTermination(5, TimeUnit.SECONDS), "server left running");
    pools.get(0).verifyInvariants();
    pools.close();
    backend.close();
  }

  private String session() {
    return allocator.openSession(OpenSessionRequest.newBuilder().setClientName("t").build()).getSessionId();
  }

  private LeaseRequest.Builder lease(String session, long size) {
    return LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(size);
  }

  /** What a refused call must not change (the ooms counter is allowed to count it). */
  private String state() {
    return admin.getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).toBuilder().clearOoms()
        .build().toString() + admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesList()
        + admin.listObjects(ListObjectsRequest.getDefaultInstance()).getObjectsList().stream()
            .map(o -> o.toBuilder().clearAgeMs().build()).toList();
  }

  /** Asserts the call fails with the code, a message containing {@code text}, and no change. */
  private void refused(Status.Code code, String text, Executable call) {
    String before = state();
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, call);
    assertEquals(code, e.getStatus().getCode(), e.getStatus().toString());
    assertTrue(e.getStatus().getDescription().contains(text),
        "message '" + e.getStatus().getDescription() + "' should contain '" + text + "'");
    assertEquals(before, state(), "a refused call changed the pool");
  }

  @Test
  void invalidArgument_rows() {
    String s = session();
    refused(Status.Code.INVALID_ARGUMENT, "size_bytes: 0 (expected: > 0)",
        () -> allocator.lease(lease(s, 0).build()));
    refused(Status.Code.INVALID_ARGUMENT, "size_bytes: -4096",
        () -> allocator.lease(lease(s, -4096).build()));
    refused(Status.Code.INVALID_ARGUMENT, "the budget of device 0",
        () -> allocator.lease(lease(s, Long.MAX_VALUE).build()));
    // Within the device's 64 MiB capacity but over its 32 MiB budget: it could never be served.
    refused(Status.Code.INVALID_ARGUMENT, "size_bytes: 50331648 (expected: at most 33554432, the budget of device 0 (32.0 MiB))",
        () -> allocator.lease(lease(s, 48 * MIB).build()));
    refused(Status.Code.INVALID_ARGUMENT, "device: 3 (expected: 0, the only device)",
        () -> allocator.lease(lease(s, 4096).setDevice(3).build()));
    refused(Status.Code.INVALID_ARGUMENT, "device: -1",
        () -> allocator.lease(lease(s, 4096).setDevice(-1).build()));
    refused(Status.Code.INVALID_ARGUMENT, "session_id: (empty)",
        () -> allocator.lease(lease("", 4096).build()));
    refused(Status.Code.INVALID_ARGUMENT, "session_id: 'xyz'",
        () -> allocator.lease(lease("xyz", 4096).build()));
    refused(Status.Code.INVALID_ARGUMENT, "lease_id: 'ZZZ'",
        () -> allocator.release(ReleaseRequest.newBuilder().setSessionId(s).setLeaseId("ZZZ").build()));
    refused(Status.Code.INVALID_ARGUMENT, "tag: 129 characters (expected: at most 128)",
        () -> allocator.lease(lease(s, 4096).setTag("t".repeat(129)).build()));
    refused(Status.Code.INVALID_ARGUMENT, "client_name: 200 characters",
        () -> allocator.openSession(OpenSessionRequest.newBuilder().setClientName("c".repeat(200)).build()));
    refused(Status.Code.INVALID_ARGUMENT, "keep_bytes: -1",
        () -> admin.trim(TrimRequest.newBuilder().setKeepBytes(-1).build()));
    refused(Status.Code.INVALID_ARGUMENT, "cap_bytes: -5",
        () -> admin.setRetentionCap(SetRetentionCapRequest.newBuilder().setCapBytes(-5).build()));
    // Above the 32 MiB budget: refused, and the cap stays what it was (state() includes it).
    refused(Status.Code.INVALID_ARGUMENT,
        "cap_bytes: 33554944 (expected: at most 33554432, the budget of device 0 (32.0 MiB))",
        () -> admin.setRetentionCap(SetRetentionCapRequest.newBuilder().setCapBytes(32 * MIB + 512).build()));
    refused(Status.Code.INVALID_ARGUMENT, "device: 9",
        () -> admin.getStats(GetStatsRequest.newBuilder().setDevice(9).build()));
    refused(Status.Code.INVALID_ARGUMENT, "limit: -2",
        () -> admin.listLeases(ListLeasesRequest.newBuilder().setLimit(-2).build()));
    LeaseResponse held = allocator.lease(lease(s, 4096).build());
    refused(Status.Code.INVALID_ARGUMENT, "cuda_ipc_event_handle: 3 bytes (expected: empty or 64 bytes)",
        () -> allocator.release(ReleaseRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId())
            .setCudaIpcEventHandle(ByteString.copyFrom(new byte[3])).build()));
    refused(Status.Code.INVALID_ARGUMENT, "host device 0 has no CUDA events",
        () -> allocator.release(ReleaseRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId())
            .setCudaIpcEventHandle(ByteString.copyFrom(new byte[64])).build()));
  }

  @Test
  void notFound_rows() {
    String s = session();
    String other = session();
    refused(Status.Code.NOT_FOUND, "not found", () -> allocator.lease(lease(SecureIds.next(), 4096).build()));
    LeaseResponse held = allocator.lease(lease(s, 4096).build());
    refused(Status.Code.NOT_FOUND, "not found", () -> allocator.release(
        ReleaseRequest.newBuilder().setSessionId(s).setLeaseId(SecureIds.next()).build()));
    refused(Status.Code.NOT_FOUND, held.getLeaseId(), () -> allocator.release(
        ReleaseRequest.newBuilder().setSessionId(other).setLeaseId(held.getLeaseId()).build()));
    allocator.release(ReleaseRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId()).build());
    refused(Status.Code.NOT_FOUND, held.getLeaseId(), () -> allocator.release(
        ReleaseRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId()).build()));
    // expired session
    ticker.advance(31, TimeUnit.SECONDS);
    registry.reap();
    refused(Status.Code.NOT_FOUND, "not found", () -> allocator.lease(lease(s, 4096).build()));
    refused(Status.Code.NOT_FOUND, "not found",
        () -> allocator.closeSession(CloseSessionRequest.newBuilder().setSessionId(s).build()));
  }

  @Test
  void sharing_rows() {
    String s = session();
    String other = session();
    LeaseResponse held = allocator.lease(lease(s, 4096).build());
    ShareRequest.Builder share = ShareRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId());
    refused(Status.Code.NOT_FOUND, "not found in this session",
        () -> allocator.share(share.clone().setSessionId(other).build()));
    refused(Status.Code.NOT_FOUND, "not found in this session",
        () -> allocator.share(share.clone().setLeaseId(SecureIds.next()).build()));
    refused(Status.Code.INVALID_ARGUMENT, "token: a value of 4 characters (not shown: it may be a secret)",
        () -> allocator.attach(AttachRequest.newBuilder().setSessionId(other).setToken("nope").build()));
    refused(Status.Code.NOT_FOUND, "share token not found (unknown, expired, revoked or used up)",
        () -> allocator.attach(AttachRequest.newBuilder().setSessionId(other).setToken(SecureIds.next()).build()));
    PublishRequest.Builder publish = PublishRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId());
    refused(Status.Code.INVALID_ARGUMENT, "name: U+0007 at index 1 (expected: printable text",
        () -> allocator.publish(publish.clone().setName("a\u0007").build()));
    refused(Status.Code.INVALID_ARGUMENT, "name: 257 characters (expected: at most 256)",
        () -> allocator.publish(publish.clone().setName("n".repeat(257)).build()));
    refused(Status.Code.INVALID_ARGUMENT, "name: '' (expected: 1 to 256 characters)",
        () -> allocator.publish(publish.clone().setName("").build()));
    allocator.publish(publish.clone().setName("weights/0").build());
    refused(Status.Code.ALREADY_EXISTS, "object 'weights/0' is already published",
        () -> allocator.publish(publish.clone().setName("weights/0").build()));
    refused(Status.Code.NOT_FOUND, "object 'weights/1' not found",
        () -> allocator.lookup(LookupRequest.newBuilder().setSessionId(other).setName("weights/1").build()));
    refused(Status.Code.NOT_FOUND, "object 'weights/1' not found",
        () -> allocator.unpublish(UnpublishRequest.newBuilder().setSessionId(other).setName("weights/1").build()));
    refused(Status.Code.NOT_FOUND, "object 'weights/1' not found",
        () -> admin.removeObject(RemoveObjectRequest.newBuilder().setName("weights/1").build()));

    // Attach to a block that went back: its token revoked after the owner released it.
    LeaseResponse gone = allocator.lease(lease(s, 8192).build());
    String token = allocator.share(ShareRequest.newBuilder().setSessionId(s).setLeaseId(gone.getLeaseId()).build())
        .getToken();
    allocator.release(ReleaseRequest.newBuilder().setSessionId(s).setLeaseId(gone.getLeaseId()).build());
    assertTrue(allocator.revokeShare(RevokeShareRequest.newBuilder().setSessionId(s).setToken(token).build())
        .getBlockReturned());
    refused(Status.Code.NOT_FOUND, "share token not found",
        () -> allocator.attach(AttachRequest.newBuilder().setSessionId(other).setToken(token).build()));
  }

  @Test
  void sharing_throughTheApi_listsHoldsAndObjects() {
    String s = session();
    String other = session();
    LeaseResponse held = allocator.lease(lease(s, 100_000).build());
    String token = allocator.share(ShareRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId())
        .setReadOnly(true).build()).getToken();
    AttachResponse attached = allocator.attach(AttachRequest.newBuilder().setSessionId(other).setToken(token)
        .setTag("reader").build());
    assertTrue(attached.getReadOnly());
    assertEquals(3, attached.getHolds(), "lease, token, attach");
    assertEquals(held.getHandle(), attached.getLease().getHandle());
    assertEquals(held.getBlockBytes(), attached.getLease().getBlockBytes());
    allocator.publish(PublishRequest.newBuilder().setSessionId(s).setLeaseId(held.getLeaseId()).setName("kv/7").build());
    List<LeaseInfo> leases = admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesList();
    assertEquals(2, leases.size());
    LeaseInfo hold = leases.get(1);
    assertEquals(attached.getLease().getLeaseId(), hold.getLeaseId());
    assertTrue(hold.getAttached());
    assertTrue(hold.getReadOnly());
    assertEquals(4, hold.getHolds());
    assertEquals("kv/7", hold.getObjectName());
    assertEquals(List.of(s, other), hold.getHolderSessionIdsList());
    assertEquals(false, leases.get(0).getAttached());

    for (int i = 0; i < 5; i++) {
      // A session of its own each (the quota here is 3 leases a session), closed at once: the
      // object outlives it.
      String publisher = session();
      LeaseResponse l = allocator.lease(lease(publisher, 4096).build());
      allocator.publish(PublishRequest.newBuilder().setSessionId(publisher).setLeaseId(l.getLeaseId())
          .setName("p" + i).build());
      allocator.closeSession(CloseSessionRequest.newBuilder().setSessionId(publisher).build());
    }
    List<String> names = new ArrayList<>();
    String page = "";
    int pages = 0;
    do {
      ListObjectsResponse r = admin.listObjects(ListObjectsRequest.newBuilder().setPageSize(2).setPageToken(page).build());
      r.getObjectsList().forEach(o -> names.add(o.getName()));
      assertEquals(6, r.getTotal());
      page = r.getNextPageToken();
      pages++;
    } while (!page.isEmpty() && pages < 10);
    assertEquals(List.of("kv/7", "p0", "p1", "p2", "p3", "p4"), names);
    assertEquals(3, pages);
    var stats = admin.getStats(GetStatsRequest.getDefaultInstance()).getDevices(0);
    assertEquals(6, stats.getPublishedObjects());
    assertEquals(1, stats.getLiveHolds());
    assertEquals(1, stats.getShares());
    assertEquals(6, stats.getSharedBlocks());
    assertEquals(32 * MIB, stats.getPublishedLimitBytes());
  }

  @Test
  void resourceExhausted_rows_stateThePoolOrQuota() {
    String s = session();
    allocator.lease(lease(s, 20 * MIB).build());
    refused(Status.Code.RESOURCE_EXHAUSTED, "(requested=16777216, leased=20971520, client_cached=0, cached=0",
        () -> allocator.lease(lease(s, 16 * MIB).build()));
    refused(Status.Code.RESOURCE_EXHAUSTED, "limit=33554432",
        () -> allocator.lease(lease(s, 16 * MIB).build()));
    allocator.lease(lease(s, 4096).build());
    allocator.lease(lease(s, 4096).build());
    refused(Status.Code.RESOURCE_EXHAUSTED, "session quota max-leases=3",
        () -> allocator.lease(lease(s, 4096).build()));
    assertEquals(2, pools.get(0).stats().get(PoolMetric.OOMS));
  }

  @Test
  void unavailable_whileDraining() {
    String s = session();
    registry.beginDrain(1000);
    refused(Status.Code.UNAVAILABLE, "shutting down", () -> allocator.lease(lease(s, 4096).build()));
    refused(Status.Code.UNAVAILABLE, "shutting down",
        () -> allocator.openSession(OpenSessionRequest.getDefaultInstance()));
  }

  @Test
  void internal_hidesTheCause_andLogsIt() throws Exception {
    String s = session();
    // Break the backend underneath the pool: the device directory disappears.
    Path devDir = dir.resolve("shm").resolve("dev0");
    List<Path> files = new ArrayList<>();
    try (var list = Files.list(devDir)) {
      list.forEach(files::add);
    }
    for (Path f : files) {
      Files.delete(f);
    }
    Files.delete(devDir);
    try (var log = new io.gpumemd.server.testing.LogCapture(StatusMapper.class)) {
      refused(Status.Code.INTERNAL, "internal error in gpumemd; the server log has the cause",
          () -> allocator.lease(lease(s, 4096).build()));
      List<String> errors = log.messages("ERROR");
      assertEquals(1, errors.size(), errors.toString());
      assertTrue(errors.get(0).contains("Lease"), errors.get(0));
    }
    Files.createDirectories(devDir);
  }

  @Test
  void listLeases_limitCutsTheList_totalCountsAll() {
    String s = session();
    List<String> ids = new ArrayList<>();
    for (int i = 0; i < 3; i++) {
      ids.add(allocator.lease(lease(s, 4096).build()).getLeaseId());
    }
    var two = admin.listLeases(ListLeasesRequest.newBuilder().setLimit(2).build());
    assertEquals(3, two.getTotal());
    assertEquals(ids.subList(0, 2), two.getLeasesList().stream().map(l -> l.getLeaseId()).toList(), "oldest first");
    assertEquals(3, admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesCount());
  }
}
