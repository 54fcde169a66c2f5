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
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.server.sharing.SharingSettings;
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
 * Admin.ListShares and Admin.RemoveShare, and the per-tenant bound on holds, through the real
 * services on an in-process transport with a fixed caller per channel: what each tenant and an
 * admin see (metadata and the public id, never the token), the precise status of every refusal,
 * and that a refusal changes nothing.
 */
class AdminSharesTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000 pid 21", false, 2000, 2000, 21, "pid 21");
  private static final Caller ROOT = new Caller("uid:0", "uid 0 pid 1", true, 0, 0, 1, "pid 1");
  /** The tenant bound on holds here: small, so that a test reaches it. */
  private static final int HOLDS_PER_TENANT = 3;

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
    registry = new SessionRegistry(pools, backend, SessionSettings.defaults().withLimits(SessionLimits.UNLIMITED)
        .withSharing(new SharingSettings(300, 3600, 4096, 4096, HOLDS_PER_TENANT)), ticker, sessions);
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

  /** What a refused call must not change: every tenant's tokens, the pool, the leases. */
  private String state() {
    return shares(root, "").getSharesList().stream().map(s -> s.toBuilder().clearAgeMs().clearExpiresInMs().build())
        .toList() + root.admin().getStats(GetStatsRequest.getDefaultInstance()).getDevices(0).toString()
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
  void listShares_showsEachTenantItsOwnAndAnAdminAll_byPublicIdNeverByToken() {
    String producer = session(alice, "producer");
    LeaseResponse lease = lease(alice, producer, 100_000);
    ShareResponse limited = share(alice, producer, lease.getLeaseId(), true, 3);
    ticker.advance(5, TimeUnit.SECONDS);
    ShareResponse open = share(alice, producer, lease.getLeaseId(), false, 0);
    String reader = session(alice, "reader");
    attach(alice, reader, limited.getToken());
    String bobs = session(bob, "bob");
    ShareResponse bobShare = share(bob, bobs, lease(bob, bobs, 4096).getLeaseId(), false, 0);
    assertTrue(SecureIds.isWellFormed(limited.getShareId()));
    assertFalse(limited.getShareId().equals(limited.getToken()), "the public id is not the token");

    ListSharesResponse own = shares(alice, "");
    assertEquals(2, own.getTotal());
    assertEquals(List.of(limited.getShareId(), open.getShareId()), own.getSharesList().stream()
        .map(ShareInfo::getShareId).toList(), "oldest first");
    ShareInfo first = own.getShares(0);
    assertEquals("uid:1000", first.getTenant());
    assertEquals(producer, first.getSessionId());
    assertEquals("producer", first.getClientName());
    assertEquals(lease.getLeaseId(), first.getLeaseId());
    assertEquals(0, first.getDevice());
    assertEquals(lease.getHandle().getSegmentId(), first.getSegmentId());
    assertEquals(lease.getHandle().getOffset(), first.getOffset());
    assertEquals(100_000, first.getSizeBytes());
    assertEquals(lease.getBlockBytes(), first.getBlockBytes());
    assertTrue(first.getReadOnly());
    assertEquals(3, first.getMaxAttaches());
    assertEquals(1, first.getAttaches());
    assertEquals(2, first.getAttachesLeft());
    assertEquals(295_000, first.getExpiresInMs());
    assertEquals(5_000, first.getAgeMs());
    assertEquals(4, first.getHolds(), "the lease, two tokens, the attach");
    assertEquals(-1, own.getShares(1).getAttachesLeft(), "any number");
    for (String token : List.of(limited.getToken(), open.getToken(), bobShare.getToken())) {
      assertFalse(shares(root, "").toString().contains(token), "a listing never shows a token");
    }

    assertEquals(List.of(bobShare.getShareId()), shares(bob, "").getSharesList().stream().map(ShareInfo::getShareId)
        .toList(), "bob sees his own only");
    assertEquals(3, shares(root, "").getTotal(), "an admin sees every tenant's");
    assertEquals(2, shares(root, "uid:1000").getTotal());
    assertEquals(2, shares(alice, "uid:1000").getTotal(), "naming its own tenant is fine");
    refused(Status.Code.PERMISSION_DENIED, "listing another tenant's share tokens needs an admin identity (root, "
        + "the daemon's uid, a member of --admin-group, or an admin token); uid 2000 pid 21 is not one",
        () -> shares(bob, "uid:1000"));
    refused(Status.Code.PERMISSION_DENIED, "needs an admin identity", () -> shares(bob, "uid:4242"));

    // Pages of one, in order: by tenant (uid:1000 before uid:2000), then by age.
    List<String> paged = new ArrayList<>();
    String page = "";
    int pages = 0;
    do {
      ListSharesResponse r = root.admin().listShares(ListSharesRequest.newBuilder().setPageSize(1).setPageToken(page)
          .build());
      r.getSharesList().forEach(s -> paged.add(s.getShareId()));
      assertEquals(3, r.getTotal());
      page = r.getNextPageToken();
      pages++;
    } while (!page.isEmpty() && pages < 10);
    assertEquals(List.of(limited.getShareId(), open.getShareId(), bobShare.getShareId()), paged);
    String objectsToken = PageTokens.objectToken(new io.gpumemd.server.sharing.PublishedObject("uid:0", "x", null,
        false, 0, "", null));
    refused(Status.Code.INVALID_ARGUMENT, "page_token: '" + objectsToken + "' (expected: empty, or the "
        + "next_page_token of the previous page of this listing)",
        () -> root.admin().listShares(ListSharesRequest.newBuilder().setPageToken(objectsToken).build()));
    refused(Status.Code.INVALID_ARGUMENT, "page_size: -1",
        () -> root.admin().listShares(ListSharesRequest.newBuilder().setPageSize(-1).build()));

    // Expired tokens are left out at once, before the housekeeping ends their holds.
    ticker.advance(295, TimeUnit.SECONDS);
    assertEquals(2, shares(root, "").getTotal(), "the first token expired");
    ticker.advance(5, TimeUnit.SECONDS);
    assertEquals(0, shares(root, "").getTotal());
  }

  @Test
  void removeShare_byAnAdmin_endsAnotherTenantsToken_andItsBlockGoesBackWithItsLastHolder() {
    String producer = session(alice, "producer");
    LeaseResponse lease = lease(alice, producer, 8192);
    ShareResponse shared = share(alice, producer, lease.getLeaseId(), false, 0);
    String consumer = session(alice, "consumer");
    LeaseResponse hold = attach(alice, consumer, shared.getToken());
    release(alice, producer, lease.getLeaseId());

    refused(Status.Code.INVALID_ARGUMENT, "share_id: a value of 4 characters (not shown: it may be a secret)",
        () -> removeShare(root, "uid:1000", "nope"));
    // Another tenant's id, or one that exists nowhere: the same refusal, before any look-up.
    refused(Status.Code.PERMISSION_DENIED, "revoking another tenant's share token needs an admin identity",
        () -> removeShare(bob, "uid:1000", shared.getShareId()));
    refused(Status.Code.PERMISSION_DENIED, "revoking another tenant's share token needs an admin identity",
        () -> removeShare(bob, "uid:1000", SecureIds.next()));
    // Bob's own tenant has no such token; the answer does not echo what he sent.
    StatusRuntimeException foreign = assertThrows(StatusRuntimeException.class,
        () -> removeShare(bob, "", shared.getShareId()));
    assertEquals(Status.Code.NOT_FOUND, foreign.getStatus().getCode());
    assertFalse(foreign.getStatus().getDescription().contains(shared.getShareId()), foreign.getStatus().toString());
    refused(Status.Code.NOT_FOUND, "share token of tenant uid:0 not found by that share_id",
        () -> removeShare(root, "", shared.getShareId()));
    refused(Status.Code.NOT_FOUND, "share token of tenant uid:2000 not found",
        () -> removeShare(root, "uid:2000", shared.getShareId()));
    LeaseResponse stillWorks = attach(alice, consumer, shared.getToken());
    release(alice, consumer, stillWorks.getLeaseId());

    try (LogCapture audit = new LogCapture(SharedObjects.class)) {
      assertFalse(removeShare(root, "uid:1000", shared.getShareId()), "the consumer still holds the block");
      List<String> lines = audit.messages("INFO");
      assertEquals(1, lines.size(), lines.toString());
      assertTrue(lines.get(0).matches("Share token " + shared.getShareId() + " of tenant uid:1000 \\(made by session "
          + producer.substring(0, 8) + " for lease " + lease.getLeaseId() + "\\) revoked by uid 0 pid 1 \\(admin\\)"),
          lines.get(0));
    }
    refused(Status.Code.NOT_FOUND, "share token not found",
        () -> attach(alice, consumer, shared.getToken()));
    refused(Status.Code.NOT_FOUND, "not found", () -> removeShare(root, "uid:1000", shared.getShareId()));
    assertEquals(0, shares(root, "").getTotal());
    assertEquals(lease.getBlockBytes(), leasedBytes(), "the consumer's hold keeps the block");
    release(alice, consumer, hold.getLeaseId());
    assertEquals(0, leasedBytes(), "back with its last holder");
  }

  @Test
  void removeShare_ofTheLastHold_returnsTheBlock_andAnOwnerMayRevokeItsOwnBySessionlessId() {
    String producer = session(alice, "producer");
    LeaseResponse first = lease(alice, producer, 4096);
    LeaseResponse second = lease(alice, producer, 4096);
    ShareResponse one = share(alice, producer, first.getLeaseId(), false, 0);
    ShareResponse two = share(alice, producer, second.getLeaseId(), false, 0);
    release(alice, producer, first.getLeaseId());
    release(alice, producer, second.getLeaseId());
    long bothBlocks = first.getBlockBytes() + second.getBlockBytes();
    assertEquals(bothBlocks, leasedBytes(), "the tokens hold the blocks");
    assertTrue(removeShare(root, "uid:1000", one.getShareId()), "the token was the block's last hold");
    assertTrue(removeShare(alice, "", two.getShareId()), "its own tenant's, without a session");
    assertEquals(0, leasedBytes());
    // and a published name keeps working beside (RemoveShare touches tokens only)
    String again = session(alice, "again");
    LeaseResponse named = lease(alice, again, 4096);
    alice.allocator().publish(PublishRequest.newBuilder().setSessionId(again).setLeaseId(named.getLeaseId())
        .setName("kv").build());
    assertEquals(1, root.admin().listObjects(ListObjectsRequest.getDefaultInstance()).getTotal());
    assertEquals(0, shares(root, "").getTotal());
  }

  @Test
  void holdsPerTenant_throughTheApi_resourceExhaustedNamingTenantBoundAndFlag() {
    String producer = session(alice, "producer");
    String token = share(alice, producer, lease(alice, producer, 4096).getLeaseId(), false, 0).getToken();
    List<String> readers = List.of(session(alice, "r1"), session(alice, "r2"));
    for (int i = 0; i < HOLDS_PER_TENANT; i++) {
      attach(alice, readers.get(i % 2), token);
    }
    refused(Status.Code.RESOURCE_EXHAUSTED, "tenant uid:1000 has 3 holds on shared blocks over all its sessions, "
        + "the bound of 3 (flag --max-holds-per-tenant); release holds it no longer needs",
        () -> attach(alice, readers.get(1), token));
    // Another tenant (an admin too) goes on.
    String roots = session(root, "root");
    String rootToken = share(root, roots, lease(root, roots, 4096).getLeaseId(), false, 0).getToken();
    for (int i = 0; i <= HOLDS_PER_TENANT - 1; i++) {
      attach(root, roots, rootToken);
    }
  }
}
