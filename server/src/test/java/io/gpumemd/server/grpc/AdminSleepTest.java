package io.gpumemd.server.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.common.util.concurrent.ListenableFuture;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.SleepAsked;
import io.gpumemd.proto.v1.SleepRequest;
import io.gpumemd.proto.v1.SleepResponse;
import io.gpumemd.proto.v1.SleepSessionRequest;
import io.gpumemd.proto.v1.StreamError;
import io.gpumemd.proto.v1.WakeRequest;
import io.gpumemd.proto.v1.WakeResponse;
import io.gpumemd.proto.v1.WakeSessionRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.testing.FakeTicker;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Admin.SleepSession and WakeSession through the real services on an in-process transport, with
 * the session's client played by a raw KeepAlive stream that says (or not) that it has a sleep
 * handler and answers (or not) the daemon's SleepAsked: every refusal, the bound on a client that
 * never answers, a late answer refused, a client's refusal passed on, and a sleep and wake that
 * reach the admin with what the client's calls did.
 */
class AdminSleepTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000 pid 21", false, 2000, 2000, 21, "pid 21");
  private static final Caller ROOT = new Caller("uid:0", "uid 0 pid 1", true, 0, 0, 1, "pid 1");
  /** How long a client has to answer here (--unmap-wait-ms): short, for the test of one that never does. */
  private static final long ASK_WAIT_MS = 300;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private final List<Server> servers = new ArrayList<>();
  private final List<ManagedChannel> channels = new ArrayList<>();
  private final List<StreamObserver<KeepAliveRequest>> streams = new ArrayList<>();
  private final LinkedBlockingQueue<SessionEvent> asks = new LinkedBlockingQueue<>();

  private record Stubs(AllocatorGrpc.AllocatorBlockingStub allocator, AllocatorGrpc.AllocatorStub async,
      AdminGrpc.AdminBlockingStub admin, AdminGrpc.AdminFutureStub adminFuture) {}

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
        ticker, sessions, 16 * MIB);
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
        .addService(new AdminService(pools, registry, Runnable::run, ASK_WAIT_MS))
        .intercept(Callers.fixed(caller))
        .build().start());
    ManagedChannel channel = InProcessChannelBuilder.forName(name).directExecutor().build();
    channels.add(channel);
    return new Stubs(AllocatorGrpc.newBlockingStub(channel), AllocatorGrpc.newStub(channel),
        AdminGrpc.newBlockingStub(channel), AdminGrpc.newFutureStub(channel));
  }

  @AfterEach
  void stop() throws Exception {
    streams.forEach(StreamObserver::onCompleted);
    channels.forEach(ManagedChannel::shutdownNow);
    for (Server server : servers) {
      server.shutdownNow();
      assertTrue(server.awaitTermination(5, TimeUnit.SECONDS), "server left running");
    }
    assertEquals(0, registry.sleep().asks().awaiting(), "an admin's ask left awaiting");
    pools.get(0).verifyInvariants();
    pools.close();
    backend.close();
  }

  /** A session of Alice's with a KeepAlive stream that queues the asks it gets; opted in or not. */
  private String session(boolean sleepHandler) throws InterruptedException {
    String id = alice.allocator().openSession(OpenSessionRequest.newBuilder().setClientName("sleeper").build())
        .getSessionId();
    LinkedBlockingQueue<SessionEvent> attached = new LinkedBlockingQueue<>();
    StreamObserver<KeepAliveRequest> stream = alice.async().keepAlive(new StreamObserver<>() {
      @Override
      public void onNext(SessionEvent event) {
        (event.hasSleepAsked() ? asks : attached).add(event);
      }

      @Override
      public void onError(Throwable t) {}

      @Override
      public void onCompleted() {}
    });
    streams.add(stream);
    KeepAliveRequest.Builder hello = KeepAliveRequest.newBuilder().setSessionId(id);
    if (sleepHandler) {
      hello.setSleepHandler(true);
    }
    stream.onNext(hello.build());
    assertNotNull(attached.poll(5, TimeUnit.SECONDS), "no attach within 5 s");
    return id;
  }

  private LeaseResponse lease(String session, long size) {
    return alice.allocator().lease(LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(size)
        .build());
  }

  private SleepAsked nextAsk() throws InterruptedException {
    SessionEvent event = asks.poll(5, TimeUnit.SECONDS);
    assertNotNull(event, "no SleepAsked within 5 s");
    return event.getSleepAsked();
  }

  private SessionInfo info(String session) {
    return root.admin().listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
        .filter(s -> s.getSessionId().equals(session)).findFirst().orElseThrow();
  }

  private static StatusRuntimeException failure(ListenableFuture<?> call) throws InterruptedException {
    ExecutionException e = assertThrows(ExecutionException.class, () -> call.get(5, TimeUnit.SECONDS));
    return (StatusRuntimeException) e.getCause();
  }

  private static void assertStatus(Status.Code code, String text, StatusRuntimeException e) {
    assertEquals(code, e.getStatus().getCode(), e.getMessage());
    assertTrue(e.getStatus().getDescription().contains(text), e.getStatus().getDescription());
  }

  @Test
  void aSessionWhoseClientRegisteredNoHandler_isRefusedAtOnce_namingWhy_andNothingSleeps() throws Exception {
    String session = session(false);
    lease(session, 4 * MIB);
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
        () -> root.admin().sleepSession(SleepSessionRequest.newBuilder().setSessionId(session).build()));
    assertStatus(Status.Code.FAILED_PRECONDITION, "session " + session + "'s client registered no sleep handler", e);
    assertTrue(asks.isEmpty(), "the client was asked anyway");
    assertEquals(0, info(session).getSleepingLeases());
  }

  @Test
  void anUnknownSession_orAnotherTenants_isNotFound_andABadLevelIsInvalid() throws Exception {
    String session = session(true);
    StatusRuntimeException unknown = assertThrows(StatusRuntimeException.class, () -> root.admin()
        .sleepSession(SleepSessionRequest.newBuilder().setSessionId("0123456789abcdef0123456789abcdef").build()));
    assertEquals(Status.Code.NOT_FOUND, unknown.getStatus().getCode());
    StatusRuntimeException other = assertThrows(StatusRuntimeException.class,
        () -> bob.admin().sleepSession(SleepSessionRequest.newBuilder().setSessionId(session).build()));
    assertStatus(Status.Code.NOT_FOUND, "session " + session + " not found", other);
    StatusRuntimeException level = assertThrows(StatusRuntimeException.class, () -> root.admin()
        .sleepSession(SleepSessionRequest.newBuilder().setSessionId(session).setLevel(3).build()));
    assertStatus(Status.Code.INVALID_ARGUMENT, "level: 3", level);
    StatusRuntimeException awake = assertThrows(StatusRuntimeException.class,
        () -> root.admin().wakeSession(WakeSessionRequest.newBuilder().setSessionId(session).build()));
    assertStatus(Status.Code.FAILED_PRECONDITION, "is awake", awake);
    assertTrue(asks.isEmpty(), "the client was asked anyway");
  }

  @Test
  void aClientThatNeverAnswers_failsTheAdminsCallPastTheWait_andItsLateSleepIsRefused() throws Exception {
    String session = session(true);
    LeaseResponse lease = lease(session, 4 * MIB);
    ListenableFuture<SleepResponse> call = root.adminFuture().sleepSession(
        SleepSessionRequest.newBuilder().setSessionId(session).build());
    SleepAsked ask = nextAsk();
    assertStatus(Status.Code.DEADLINE_EXCEEDED, "session " + session + "'s client did not answer", failure(call));
    StatusRuntimeException late = assertThrows(StatusRuntimeException.class, () -> alice.allocator().sleep(
        SleepRequest.newBuilder().setSessionId(session).setLevel(1).setAdminRequestId(ask.getRequestId())
            .addVacatedSegmentIds(lease.getHandle().getSegmentId()).build()));
    assertStatus(Status.Code.FAILED_PRECONDITION, "not an admin's sleep", late);
    assertEquals(0, info(session).getSleepingLeases(), "the late sleep changed something");
  }

  @Test
  void theClientsRefusal_reachesTheAdmin_withItsCode_andNothingSleeps() throws Exception {
    String session = session(true);
    lease(session, 4 * MIB);
    ListenableFuture<SleepResponse> call = root.adminFuture().sleepSession(
        SleepSessionRequest.newBuilder().setSessionId(session).build());
    SleepAsked ask = nextAsk();
    assertFalse(ask.getWake());
    alice.allocator().sleep(SleepRequest.newBuilder().setSessionId(session).setAdminRequestId(ask.getRequestId())
        .setRefused(StreamError.newBuilder().setCode(Status.Code.ABORTED.value()).setMessage("mid-batch")).build());
    assertStatus(Status.Code.ABORTED, "session " + session + "'s client refused the admin's sleep: mid-batch",
        failure(call));
    assertEquals(0, info(session).getSleepingLeases());
  }

  @Test
  void theDaemonsRefusalOfTheClientsSleep_reachesTheAdmin() throws Exception {
    String session = session(true);
    lease(session, 4 * MIB);
    ListenableFuture<SleepResponse> call = root.adminFuture().sleepSession(
        SleepSessionRequest.newBuilder().setSessionId(session).build());
    SleepAsked ask = nextAsk();
    // The client vacated nothing: INVALID_ARGUMENT for it, and for the admin.
    StatusRuntimeException refused = assertThrows(StatusRuntimeException.class, () -> alice.allocator().sleep(
        SleepRequest.newBuilder().setSessionId(session).setLevel(1).setAdminRequestId(ask.getRequestId()).build()));
    assertEquals(Status.Code.INVALID_ARGUMENT, refused.getStatus().getCode());
    assertStatus(Status.Code.INVALID_ARGUMENT, "session " + session + "'s Sleep was refused: vacated_segment_ids",
        failure(call));
  }

  @Test
  void anAnsweredSleepAndWake_giveTheAdminWhatTheClientsCallsDid_andEachStateRefusesItsRepeat() throws Exception {
    String session = session(true);
    LeaseResponse lease = lease(session, 4 * MIB);
    ListenableFuture<SleepResponse> sleep = root.adminFuture().sleepSession(
        SleepSessionRequest.newBuilder().setSessionId(session).setLevel(2).addTags("").build());
    SleepAsked ask = nextAsk();
    assertEquals(2, ask.getLevel());
    StatusRuntimeException twice = assertThrows(StatusRuntimeException.class,
        () -> root.admin().sleepSession(SleepSessionRequest.newBuilder().setSessionId(session).build()));
    assertStatus(Status.Code.FAILED_PRECONDITION, "is being asked to sleep already", twice);
    SleepResponse own = alice.allocator().sleep(SleepRequest.newBuilder().setSessionId(session)
        .setLevel(ask.getLevel()).addAllTags(ask.getTagsList()).setAdminRequestId(ask.getRequestId())
        .addVacatedSegmentIds(lease.getHandle().getSegmentId()).build());
    SleepResponse admins = sleep.get(5, TimeUnit.SECONDS);
    assertEquals(List.of(lease.getLeaseId()), admins.getLeaseIdsList());
    assertEquals(own, admins);
    assertTrue(admins.getFreedBytes() >= 4 * MIB, admins.toString());
    assertEquals(1, info(session).getSleepingLeases());

    StatusRuntimeException asleep = assertThrows(StatusRuntimeException.class,
        () -> root.admin().sleepSession(SleepSessionRequest.newBuilder().setSessionId(session).build()));
    assertStatus(Status.Code.FAILED_PRECONDITION, "sleeps already (1 leases asleep)", asleep);

    ListenableFuture<WakeResponse> wake = alice.adminFuture().wakeSession(
        WakeSessionRequest.newBuilder().setSessionId(session).build()); // the tenant's own session: no admin needed
    SleepAsked wakeAsk = nextAsk();
    assertTrue(wakeAsk.getWake());
    WakeResponse woken = alice.allocator().wake(WakeRequest.newBuilder().setSessionId(session)
        .setAdminRequestId(wakeAsk.getRequestId()).build());
    assertEquals(woken, wake.get(5, TimeUnit.SECONDS));
    assertEquals(List.of(lease.getLeaseId()), woken.getSegments(0).getLeaseIdsList());
    assertEquals(0, info(session).getSleepingLeases());
  }

  @Test
  void aClientThatWithdrawsItsHandler_isNoLongerAsked() throws Exception {
    String session = session(true);
    streams.get(0).onNext(KeepAliveRequest.newBuilder().setSleepHandler(false).build());
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
        () -> root.admin().sleepSession(SleepSessionRequest.newBuilder().setSessionId(session).build()));
    assertStatus(Status.Code.FAILED_PRECONDITION, "registered no sleep handler", e);
  }
}
