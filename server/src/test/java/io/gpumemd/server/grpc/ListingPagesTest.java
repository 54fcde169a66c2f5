package io.gpumemd.server.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListLeasesResponse;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.sharing.SharingSettings;
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
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * ListSessions and ListLeases page by page, over an in-process transport: 100,000 sessions
 * listed whole, pages that neither repeat nor skip while sessions come and go, tenants kept to
 * their own, page sizes bounded, tokens checked.
 */
class ListingPagesTest {
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private final StreamWatchdog watchdog = new StreamWatchdog(StreamWatchdog.DEFAULT_STALL_MILLIS, ticker);
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private final List<Server> servers = new ArrayList<>();
  private final List<ManagedChannel> channels = new ArrayList<>();

  private void start() {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64L << 20, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(64L << 20, 64L << 20, 20L << 20),
        sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of(),
        0, Quota.UNLIMITED, false, SessionLimits.UNLIMITED, SharingSettings.DEFAULTS), ticker, sessions);
  }

  /** The Admin service as {@code caller} sees it. */
  private AdminGrpc.AdminBlockingStub admin(Caller caller) throws Exception {
    String name = InProcessServerBuilder.generateName();
    servers.add(InProcessServerBuilder.forName(name).directExecutor()
        .addService(new AdminService(pools, registry, Runnable::run))
        .addService(new AllocatorService(registry, Runnable::run,
            new ServerMetrics(new SimpleMeterRegistry(), pools, registry::sessionCount, backend), watchdog))
        .intercept(Callers.fixed(caller))
        .build().start());
    ManagedChannel channel = InProcessChannelBuilder.forName(name).directExecutor().build();
    channels.add(channel);
    return AdminGrpc.newBlockingStub(channel);
  }

  @AfterEach
  void stop() throws Exception {
    channels.forEach(ManagedChannel::shutdownNow);
    for (Server server : servers) {
      server.shutdownNow();
      assertTrue(server.awaitTermination(5, TimeUnit.SECONDS), "server left running");
    }
    if (pools != null) {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  /** Every session, following next_page_token. */
  private static List<SessionInfo> allSessions(AdminGrpc.AdminBlockingStub admin, int pageSize, int[] pages) {
    List<SessionInfo> all = new ArrayList<>();
    String token = "";
    do {
      ListSessionsResponse page = admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(pageSize)
          .setPageToken(token).build());
      all.addAll(page.getSessionsList());
      token = page.getNextPageToken();
      pages[0]++;
    } while (!token.isEmpty());
    return all;
  }

  @Test
  void hundredThousandSessions_listedWholeInPagesOfTheDefaultSize() throws Exception {
    start();
    List<String> opened = new ArrayList<>();
    for (int i = 0; i < 100_000; i++) {
      opened.add(registry.open(Caller.DAEMON, "w" + (i % 100), 0, 0).id());
      if (i % 7 == 0) {
        ticker.advance(1, TimeUnit.MICROSECONDS); // many share an open time: the id breaks the tie
      }
    }
    AdminGrpc.AdminBlockingStub admin = admin(Caller.DAEMON);
    ListSessionsResponse first = admin.listSessions(ListSessionsRequest.getDefaultInstance());
    assertEquals(1000, first.getSessionsCount(), "the default page size");
    assertEquals(100_000, first.getTotal());
    assertTrue(first.getSerializedSize() < (4 << 20), "a page fits a client's default inbound limit");
    int[] pages = {0};
    List<SessionInfo> all = allSessions(admin, 0, pages);
    assertEquals(100, pages[0]);
    assertEquals(100_000, all.size());
    Set<String> ids = new HashSet<>();
    all.forEach(s -> ids.add(s.getSessionId()));
    assertEquals(new HashSet<>(opened), ids, "every session once");
    for (int i = 1; i < all.size(); i++) {
      assertTrue(all.get(i - 1).getAgeMs() >= all.get(i).getAgeMs(), "oldest first");
    }
    ListSessionsResponse big = admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(1_000_000).build());
    assertEquals(5000, big.getSessionsCount(), "a page size over the maximum is lowered to it");
  }

  @Test
  void sessionPages_neitherRepeatNorSkip_whileSessionsComeAndGo() throws Exception {
    start();
    List<Session> opened = new ArrayList<>();
    for (int i = 0; i < 10; i++) {
      opened.add(registry.open(Caller.DAEMON, "s" + i, 0, -1));
      ticker.advance(1, TimeUnit.MILLISECONDS);
    }
    AdminGrpc.AdminBlockingStub admin = admin(Caller.DAEMON);
    ListSessionsResponse one = admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(4).build());
    assertEquals(List.of("s0", "s1", "s2", "s3"), one.getSessionsList().stream().map(SessionInfo::getClientName).toList());
    registry.close(Caller.DAEMON, opened.get(1).id()); // already listed
    registry.close(Caller.DAEMON, opened.get(5).id()); // not yet listed: skipped, nothing else shifts
    registry.open(Caller.DAEMON, "late", 0, -1);           // opened after the first page: comes last
    ticker.advance(1, TimeUnit.MILLISECONDS);
    ListSessionsResponse two = admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(4)
        .setPageToken(one.getNextPageToken()).build());
    assertEquals(List.of("s4", "s6", "s7", "s8"), two.getSessionsList().stream().map(SessionInfo::getClientName).toList());
    ListSessionsResponse three = admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(4)
        .setPageToken(two.getNextPageToken()).build());
    assertEquals(List.of("s9", "late"), three.getSessionsList().stream().map(SessionInfo::getClientName).toList());
    assertEquals("", three.getNextPageToken(), "the last page");
  }

  @Test
  void sessionPages_showATenantItsOwnOnly() throws Exception {
    start();
    for (int i = 0; i < 30; i++) {
      registry.open(i % 3 == 0 ? ALICE : Caller.DAEMON, "s" + i, 0, 0);
    }
    int[] pages = {0};
    List<SessionInfo> alice = allSessions(admin(ALICE), 4, pages);
    assertEquals(10, alice.size());
    assertEquals(3, pages[0]);
    alice.forEach(s -> assertEquals("uid:1000", s.getTenant()));
    assertEquals(10, admin(ALICE).listSessions(ListSessionsRequest.newBuilder().setPageSize(1).build()).getTotal());
  }

  @Test
  void leasePages_followTheGrantOrder_withTotalAndFilters() throws Exception {
    start();
    Session a = registry.open(Caller.DAEMON, "a", 0, -1);
    Session b = registry.open(Caller.DAEMON, "b", 0, -1);
    List<String> ofA = new ArrayList<>();
    for (int i = 0; i < 7; i++) {
      ofA.add(registry.lease(Caller.DAEMON, a.id(), 0, 4096, false, "", false).id());
      registry.lease(Caller.DAEMON, b.id(), 0, 4096, false, "", false);
    }
    AdminGrpc.AdminBlockingStub admin = admin(Caller.DAEMON);
    List<String> listed = new ArrayList<>();
    String token = "";
    int pages = 0;
    do {
      ListLeasesResponse page = admin.listLeases(ListLeasesRequest.newBuilder().setSessionId(a.id()).setPageSize(3)
          .setPageToken(token).build());
      assertEquals(pages == 0 ? 7 : 6, page.getTotal(), "all matching leases when the page was made");
      page.getLeasesList().forEach(l -> listed.add(l.getLeaseId()));
      token = page.getNextPageToken();
      pages++;
      if (pages == 1) {
        LeaseRecord fourth = registry.leases(Caller.DAEMON, null, a.id()).get(3);
        registry.release(Caller.DAEMON, a.id(), fourth.id(), new byte[0]); // released before its page: skipped
        ofA.remove(fourth.id());
      }
    } while (!token.isEmpty());
    assertEquals(ofA, listed);
    assertEquals(2, pages);
    ListLeasesResponse old = admin.listLeases(ListLeasesRequest.newBuilder().setLimit(2).build());
    assertEquals(2, old.getLeasesCount(), "the old limit field still sizes the page");
    assertEquals(13, old.getTotal());
    assertTrue(!old.getNextPageToken().isEmpty());
  }

  @Test
  void badPageRequests_areInvalidArgument() throws Exception {
    start();
    registry.open(Caller.DAEMON, "a", 0, -1);
    registry.open(Caller.DAEMON, "b", 0, -1);
    AdminGrpc.AdminBlockingStub admin = admin(Caller.DAEMON);
    String sessionToken = admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(1).build()).getNextPageToken();
    for (String token : List.of("garbage!", "bm9wZQ", sessionToken)) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> admin.listLeases(ListLeasesRequest.newBuilder().setPageToken(token).build()));
      assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode(), token);
      assertTrue(e.getStatus().getDescription().startsWith("page_token: '"), e.getMessage());
    }
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
        () -> admin.listSessions(ListSessionsRequest.newBuilder().setPageSize(-1).build()));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
    assertThrows(StatusRuntimeException.class,
        () -> admin.listSessions(ListSessionsRequest.newBuilder().setPageToken("x".repeat(300)).build()));
  }
}
