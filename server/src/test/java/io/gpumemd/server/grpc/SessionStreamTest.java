package io.gpumemd.server.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseReply;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.testing.EventStream;
import io.gpumemd.server.testing.FakeTicker;
import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The session's fast path on its KeepAlive stream, through the real services on an in-process
 * transport: leases answered by request id with the unary call's status on refusal, releases
 * as notices, the cache tier's notices and counters, ReturnCache on a trim, and the bound on
 * outstanding requests.
 */
class SessionStreamTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private final StreamWatchdog watchdog = new StreamWatchdog(StreamWatchdog.DEFAULT_STALL_MILLIS, ticker);
  /** The backend executor, run by the test: tasks wait here until {@link #runBackendTasks}. */
  private final ConcurrentLinkedQueue<Runnable> backendTasks = new ConcurrentLinkedQueue<>();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private Server server;
  private ManagedChannel channel;
  private AllocatorGrpc.AllocatorBlockingStub allocator;
  private AdminGrpc.AdminBlockingStub admin;
  private final BlockingQueue<SessionEvent> events = new LinkedBlockingQueue<>();
  private StreamObserver<KeepAliveRequest> stream;
  private String sessionId;

  @BeforeEach
  void start() throws Exception {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(32 * MIB, 32 * MIB, 20 * MIB, 5_000),
        sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend,
        new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of("one-lease", new Quota(0, 1)), 16 * MIB),
        ticker, sessions);
    String name = InProcessServerBuilder.generateName();
    server = InProcessServerBuilder.forName(name).directExecutor()
        .addService(new AllocatorService(registry, backendTasks::add,
            new ServerMetrics(new SimpleMeterRegistry(), pools, registry::sessionCount, backend), watchdog))
        .addService(new AdminService(pools, registry, r -> new Thread(r).start()))
        // in-process calls identify nobody: they act as the daemon (an admin), as embedded callers do
        .intercept(Callers.fixed(Caller.DAEMON))
        .build().start();
    channel = InProcessChannelBuilder.forName(name).directExecutor().build();
    allocator = AllocatorGrpc.newBlockingStub(channel);
    admin = AdminGrpc.newBlockingStub(channel);
  }

  @AfterEach
  void stop() throws Exception {
    if (stream != null) {
      stream.onCompleted();
    }
    channel.shutdownNow();
    server.shutdownNow();
    assertTrue(server.awaitTermination(5, TimeUnit.SECONDS), "server left running");
    pools.get(0).verifyInvariants();
    pools.close();
    backend.close();
  }

  private void runBackendTasks() {
    Runnable task;
    while ((task = backendTasks.poll()) != null) {
      task.run();
    }
  }

  private OpenSessionResponse open(OpenSessionRequest.Builder request) throws InterruptedException {
    OpenSessionResponse opened = allocator.openSession(
        (request.getClientName().isEmpty() ? request.setClientName("stream-test") : request).build());
    sessionId = opened.getSessionId();
    stream = EventStream.attach(channel, sessionId, events);
    assertTrue(next().hasAttached());
    return opened;
  }

  private SessionEvent next() throws InterruptedException {
    SessionEvent event = events.poll(5, TimeUnit.SECONDS);
    assertTrue(event != null, "no event within 5 s");
    return event;
  }

  private static StreamLease lease(long id, long size) {
    return StreamLease.newBuilder().setRequestId(id).setDevice(0).setSizeBytes(size).build();
  }

  private DeviceStats stats() {
    return admin.getStats(GetStatsRequest.getDefaultInstance()).getDevices(0);
  }

  private SessionInfo sessionInfo() {
    return admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
        .filter(s -> s.getSessionId().equals(sessionId)).findFirst().orElseThrow();
  }

  @Test
  void openSession_grantsTheDefaultAllowance_orLess_orNone_andRefusesANegativeOne() throws Exception {
    assertEquals(16 * MIB, allocator.openSession(OpenSessionRequest.newBuilder().build()).getClientCacheBytes());
    assertEquals(MIB, allocator.openSession(OpenSessionRequest.newBuilder().setClientCacheBytes(MIB).build())
        .getClientCacheBytes());
    assertEquals(16 * MIB, allocator.openSession(OpenSessionRequest.newBuilder().setClientCacheBytes(1L << 40).build())
        .getClientCacheBytes(), "never more than the default");
    assertEquals(0, allocator.openSession(OpenSessionRequest.newBuilder().setClientCacheBytes(0).build())
        .getClientCacheBytes());
    StatusRuntimeException e = org.junit.jupiter.api.Assertions.assertThrows(StatusRuntimeException.class,
        () -> allocator.openSession(OpenSessionRequest.newBuilder().setClientCacheBytes(-5).build()));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
    assertEquals("client_cache_bytes: -5 (expected: >= 0)", e.getStatus().getDescription());
  }

  @Test
  void aNewStream_isToldHowManyMessagesOfTheSessionWereApplied_theAttachingOneToo() throws Exception {
    open(OpenSessionRequest.newBuilder());
    assertEquals(0, sessionInfo().getLeases());
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 4096)).build());
    runBackendTasks();
    assertTrue(next().getLeaseReply().hasLease());
    stream.onNext(KeepAliveRequest.getDefaultInstance()); // counted too: every message is
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(2, 4096)).build());
    runBackendTasks();
    assertTrue(next().getLeaseReply().hasLease(), "the messages before it are applied");
    stream.onCompleted(); // the session waits out its grace period for another stream
    LinkedBlockingQueue<SessionEvent> second = new LinkedBlockingQueue<>();
    StreamObserver<KeepAliveRequest> again = AllocatorGrpc.newStub(channel).keepAlive(new StreamObserver<>() {
      @Override
      public void onNext(SessionEvent event) {
        second.add(event);
      }

      @Override
      public void onError(Throwable t) {}

      @Override
      public void onCompleted() {}
    });
    stream = again;
    again.onNext(KeepAliveRequest.newBuilder().setSessionId(sessionId).build());
    SessionEvent attached = second.poll(5, TimeUnit.SECONDS);
    assertTrue(attached != null && attached.hasAttached(), String.valueOf(attached));
    assertEquals(4, attached.getAttached().getAppliedMessages(), "the first stream's hello and its three messages");
  }

  @Test
  void leasesOnTheStream_areAnsweredByRequestId_andABadOneGetsTheUnaryStatus() throws Exception {
    open(OpenSessionRequest.newBuilder());
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(7, 4096)).addLeases(lease(8, 0)).build());
    runBackendTasks(); // the first lease is a miss: served on the backend executor
    LeaseReply ok = null;
    LeaseReply bad = null;
    for (int i = 0; i < 2; i++) {
      LeaseReply reply = next().getLeaseReply();
      if (reply.getRequestId() == 7) {
        ok = reply;
      } else {
        bad = reply;
      }
    }
    assertTrue(ok.hasLease(), ok.toString());
    assertEquals(4096, ok.getLease().getSizeBytes());
    assertEquals(8, bad.getRequestId());
    StatusRuntimeException unary = org.junit.jupiter.api.Assertions.assertThrows(StatusRuntimeException.class,
        () -> allocator.lease(LeaseRequest.newBuilder().setSessionId(sessionId).setDevice(0).setSizeBytes(0).build()));
    assertEquals(unary.getStatus().getCode().value(), bad.getError().getCode());
    assertEquals(unary.getStatus().getDescription(), bad.getError().getMessage());

    // A release notice gets no answer; a bad one gets ReleaseFailed, and the stream carries on.
    stream.onNext(KeepAliveRequest.newBuilder()
        .addReleases(StreamRelease.newBuilder().setLeaseId(ok.getLease().getLeaseId()))
        .addReleases(StreamRelease.newBuilder().setLeaseId(ok.getLease().getLeaseId()))
        .addLeases(lease(9, 4096)).build());
    SessionEvent failed = next();
    assertEquals(ok.getLease().getLeaseId(), failed.getReleaseFailed().getLeaseId());
    assertEquals(Status.Code.NOT_FOUND.value(), failed.getReleaseFailed().getError().getCode());
    LeaseReply hit = next().getLeaseReply();
    assertEquals(9, hit.getRequestId());
    assertTrue(hit.getLease().getPoolHit(), "served from the block the notice released, on the transport thread");
    assertEquals(4096, stats().getLeasedBytes());
  }

  @Test
  void cacheNotices_moveBytesBetweenLeasedAndClientCached_andCountersAreExported() throws Exception {
    open(OpenSessionRequest.newBuilder());
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 2 * MIB)).build());
    runBackendTasks();
    String id = next().getLeaseReply().getLease().getLeaseId();

    // Close into the cache, reuse, close again: one batch, applied in order.
    stream.onNext(KeepAliveRequest.newBuilder()
        .addCacheNotices(CacheNotice.newBuilder().setLeaseId(id))
        .addCacheNotices(CacheNotice.newBuilder().setLeaseId(id).setReused(true))
        .addCacheNotices(CacheNotice.newBuilder().setLeaseId(id))
        .addClientCounters(ClientCacheCounters.newBuilder().setDevice(0).setHits(1).setReturns(2))
        .build());
    DeviceStats s = stats();
    assertEquals(0, s.getLeasedBytes());
    assertEquals(2 * MIB, s.getClientCachedBytes());
    assertEquals(1, s.getClientCacheHits());
    assertEquals(2, s.getClientCacheReturns());
    SessionInfo info = sessionInfo();
    assertEquals(2 * MIB, info.getClientCachedBytes());
    assertEquals(2 * MIB, info.getLeasedBytes(), "client-cached leases are still the session's");
    assertEquals(16 * MIB, info.getClientCacheAllowanceBytes());
    assertEquals(1, info.getClientCacheHits());

    // Cumulative counters: a repeat adds nothing, a rise adds the difference.
    stream.onNext(KeepAliveRequest.newBuilder()
        .addClientCounters(ClientCacheCounters.newBuilder().setDevice(0).setHits(1).setReturns(2))
        .addClientCounters(ClientCacheCounters.newBuilder().setDevice(0).setHits(4).setReturns(2)).build());
    assertEquals(4, stats().getClientCacheHits());

    // A notice about a lease that is not this session's cached one is refused by id.
    stream.onNext(KeepAliveRequest.newBuilder()
        .addCacheNotices(CacheNotice.newBuilder().setLeaseId("0".repeat(32)).setReused(true)).build());
    SessionEvent refused = next();
    assertEquals("0".repeat(32), refused.getReleaseFailed().getLeaseId());
    assertEquals(Status.Code.NOT_FOUND.value(), refused.getReleaseFailed().getError().getCode());

    // A client-cached lease is released like any other.
    stream.onNext(KeepAliveRequest.newBuilder().addReleases(StreamRelease.newBuilder().setLeaseId(id)).build());
    assertEquals(0, stats().getClientCachedBytes());
    assertEquals(2 * MIB, stats().getCachedBytes());
  }

  @Test
  void clientCachedLeases_countAgainstTheSessionsQuota() throws Exception {
    open(OpenSessionRequest.newBuilder().setClientName("one-lease"));
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 4096)).build());
    runBackendTasks();
    String id = next().getLeaseReply().getLease().getLeaseId();
    stream.onNext(KeepAliveRequest.newBuilder().addCacheNotices(CacheNotice.newBuilder().setLeaseId(id))
        .addLeases(lease(2, 4096)).build());
    LeaseReply refused = next().getLeaseReply();
    assertEquals(Status.Code.RESOURCE_EXHAUSTED.value(), refused.getError().getCode());
    assertTrue(refused.getError().getMessage().contains("max-leases=1"), refused.getError().getMessage());
    // Released, it no longer counts.
    stream.onNext(KeepAliveRequest.newBuilder().addReleases(StreamRelease.newBuilder().setLeaseId(id))
        .addLeases(lease(3, 4096)).build());
    assertTrue(next().getLeaseReply().hasLease());
  }

  @Test
  void trim_asksTheClientForItsCachedBlocks_andFreesThemWhenTheyComeBack() throws Exception {
    open(OpenSessionRequest.newBuilder());
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 4 * MIB)).build());
    runBackendTasks();
    io.gpumemd.proto.v1.LeaseResponse leased = next().getLeaseReply().getLease();
    stream.onNext(KeepAliveRequest.newBuilder()
        .addCacheNotices(CacheNotice.newBuilder().setLeaseId(leased.getLeaseId())).build());

    var trim = admin.withDeadlineAfter(10, TimeUnit.SECONDS);
    java.util.concurrent.CompletableFuture<Long> freed = java.util.concurrent.CompletableFuture.supplyAsync(
        () -> trim.trim(TrimRequest.newBuilder().setKeepBytes(0).build()).getFreedBytes());
    SessionEvent ask = next();
    assertTrue(ask.hasReturnCache(), ask.toString());
    assertEquals(4 * MIB, ask.getReturnCache().getBytes(), "what exceeds keep_bytes: all of it");
    // The client answers: it releases the cached lease, and unmaps the segment when asked.
    stream.onNext(KeepAliveRequest.newBuilder().addReleases(StreamRelease.newBuilder().setLeaseId(leased.getLeaseId())).build());
    assertEquals(4 * MIB, freed.get(10, TimeUnit.SECONDS));
    SessionEvent unmap = next();
    assertTrue(unmap.hasUnmap(), unmap.toString());
    stream.onNext(KeepAliveRequest.newBuilder().addUnmappedSegmentIds(unmap.getUnmap().getSegmentId()).build());
    assertEquals(0, stats().getReservedBytes());
  }

  @Test
  void aFloodOfLeases_isHeldAtTheBound_untilRepliesGoOut() throws Exception {
    open(OpenSessionRequest.newBuilder());
    int sent = SessionStream.MAX_OUTSTANDING + 100;
    for (int i = 0; i < sent; i++) {
      // zero=true needs the backend executor, which the test runs only later: nothing is answered.
      stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(i, 4096).toBuilder().setZero(true)).build());
    }
    assertEquals(SessionStream.MAX_OUTSTANDING, backendTasks.size(),
        "the server stops reading the stream at the bound of outstanding leases");
    int replies = 0;
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (replies < sent && System.nanoTime() < deadline) {
      runBackendTasks(); // each reply lets the server read another message
      SessionEvent event;
      while ((event = events.poll()) != null) {
        assertTrue(event.getLeaseReply().hasLease(), event.toString());
        replies++;
      }
    }
    assertEquals(sent, replies, "every lease is answered once the backend runs");
    assertEquals(sent * 4096L, stats().getLeasedBytes());
  }

  /** A KeepAlive call whose client reads nothing until the test says so. */
  private final class Unread {
    final ClientCall<KeepAliveRequest, SessionEvent> call =
        channel.newCall(AllocatorGrpc.getKeepAliveMethod(), CallOptions.DEFAULT);
    final BlockingQueue<SessionEvent> received = new LinkedBlockingQueue<>();
    final AtomicReference<Status> closed = new AtomicReference<>();

    Unread() {
      call.start(new ClientCall.Listener<>() {
        @Override
        public void onMessage(SessionEvent message) {
          received.add(message);
        }

        @Override
        public void onClose(Status status, Metadata trailers) {
          closed.set(status);
        }
      }, new Metadata());
    }

    /** Sends {@code message} as long as the server reads them, at most {@code most}; how many went. */
    int flood(KeepAliveRequest message, int most) {
      int sent = 0;
      while (sent < most && call.isReady()) {
        call.sendMessage(message);
        sent++;
      }
      return sent;
    }

    long releaseFailures() {
      return received.stream().filter(SessionEvent::hasReleaseFailed).count();
    }
  }

  private KeepAliveRequest bogusReleases(int n) {
    KeepAliveRequest.Builder m = KeepAliveRequest.newBuilder().setSessionId(sessionId);
    for (int i = 0; i < n; i++) {
      m.addReleases(StreamRelease.newBuilder().setLeaseId(String.format("%032x", i)));
    }
    return m.build();
  }

  @Test
  void aClientThatReadsNothing_isReadNoFurther_andIsClosedAfterTheStallTimeout() throws Exception {
    sessionId = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("flood").build()).getSessionId();
    Unread flood = new Unread();
    // 1,000 bogus releases a message, each answered by a ReleaseFailed the client never reads.
    int sent = flood.flood(bogusReleases(1000), 10_000);
    assertEquals(1, sent, "the server stops reading once its replies wait unsent");
    assertEquals(1, watchdog.blockedStreams());
    assertEquals(sessionId, sessionInfo().getSessionId());

    ticker.advance(StreamWatchdog.DEFAULT_STALL_MILLIS - 1, TimeUnit.MILLISECONDS);
    assertEquals(0, watchdog.closeStalled(), "not before the stall timeout");
    ticker.advance(1, TimeUnit.MILLISECONDS);
    assertEquals(1, watchdog.closeStalled());
    assertEquals(0, watchdog.blockedStreams());

    flood.call.request(Integer.MAX_VALUE);
    Status status = flood.closed.get();
    assertEquals(Status.Code.RESOURCE_EXHAUSTED, status.getCode(), String.valueOf(status));
    assertTrue(status.getDescription().contains("read none of its replies for 30000 ms (--stream-stall-timeout-ms)"),
        status.getDescription());
    assertTrue(flood.releaseFailures() <= 1, "the message was applied only as far as replies went out: "
        + flood.releaseFailures());
    // The session follows the grace rules of a stream that went away.
    registry.reap();
    assertEquals(sessionId, sessionInfo().getSessionId(), "within its grace period, a client may reconnect");
    ticker.advance(2001, TimeUnit.MILLISECONDS);
    registry.reap();
    assertTrue(admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
        .noneMatch(s -> s.getSessionId().equals(sessionId)), "the session ended after its grace period");
  }

  @Test
  void aClientThatReadsLate_getsEveryReply_andTheStreamCarriesOn() throws Exception {
    sessionId = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("slow").build()).getSessionId();
    Unread slow = new Unread();
    assertEquals(1, slow.flood(bogusReleases(1000), 10));
    slow.call.request(Integer.MAX_VALUE);
    assertEquals(1000, slow.releaseFailures(), "every release answered once the client reads");
    assertEquals(0, watchdog.blockedStreams());
    assertEquals(null, slow.closed.get());
    assertTrue(slow.call.isReady(), "the server reads the next message again");
    slow.call.sendMessage(KeepAliveRequest.newBuilder().addLeases(lease(5, 4096)).build());
    runBackendTasks();
    assertTrue(slow.received.stream().anyMatch(e -> e.getLeaseReply().getRequestId() == 5 && e.getLeaseReply().hasLease()));
    slow.call.halfClose();
  }

  @Test
  void aMessageOfTooManyEntries_endsTheStream_andChangesNothing() throws Exception {
    open(OpenSessionRequest.newBuilder());
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 4096)).build());
    runBackendTasks();
    String id = next().getLeaseReply().getLease().getLeaseId();
    KeepAliveRequest.Builder big = bogusReleases(SessionStream.MAX_ENTRIES).toBuilder()
        .addReleases(StreamRelease.newBuilder().setLeaseId(id));
    Unread client = new Unread();
    client.call.request(Integer.MAX_VALUE);
    client.call.sendMessage(big.build());
    Status status = client.closed.get();
    assertEquals(Status.Code.INVALID_ARGUMENT, status.getCode(), String.valueOf(status));
    assertEquals("KeepAlive: a message of 8193 entries (expected: at most 8192 leases, releases, cache notices, "
        + "unmapped segment ids and counters together)", status.getDescription());
    assertEquals(4096, stats().getLeasedBytes(), "its release was not applied");
  }

  @Test
  void cacheNotices_areHeldToTheAllowance_andEvictionsInTheSameMessageMakeRoom() throws Exception {
    open(OpenSessionRequest.newBuilder().setClientCacheBytes(MIB));
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, MIB)).addLeases(lease(2, MIB)).build());
    runBackendTasks();
    String a = next().getLeaseReply().getLease().getLeaseId();
    String b = next().getLeaseReply().getLease().getLeaseId();
    stream.onNext(KeepAliveRequest.newBuilder().addCacheNotices(CacheNotice.newBuilder().setLeaseId(a))
        .addCacheNotices(CacheNotice.newBuilder().setLeaseId(b)).build());
    SessionEvent refused = next();
    assertEquals(b, refused.getReleaseFailed().getLeaseId());
    assertEquals(Status.Code.RESOURCE_EXHAUSTED.value(), refused.getReleaseFailed().getError().getCode());
    assertTrue(refused.getReleaseFailed().getError().getMessage().contains(
        "would exceed the client cache allowance of 1048576 bytes (granted at OpenSession; flag --client-cache-bytes)"),
        refused.getReleaseFailed().getError().getMessage());
    assertEquals(MIB, stats().getClientCachedBytes(), "only what fits the allowance");
    assertEquals(MIB, stats().getLeasedBytes(), "the refused one is still a lease in use");

    // A client that evicts a to cache b sends both in one message: the release makes room first.
    stream.onNext(KeepAliveRequest.newBuilder().addCacheNotices(CacheNotice.newBuilder().setLeaseId(b))
        .addReleases(StreamRelease.newBuilder().setLeaseId(a)).build());
    assertEquals(MIB, stats().getClientCachedBytes());
    assertEquals(0, stats().getLeasedBytes());
    assertTrue(events.isEmpty(), "nothing refused: " + events);
  }

  @Test
  void aSessionWithoutAllowance_cachesNothing() throws Exception {
    open(OpenSessionRequest.newBuilder().setClientCacheBytes(0));
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 4096)).build());
    runBackendTasks();
    String id = next().getLeaseReply().getLease().getLeaseId();
    stream.onNext(KeepAliveRequest.newBuilder().addCacheNotices(CacheNotice.newBuilder().setLeaseId(id)).build());
    SessionEvent refused = next();
    assertEquals(Status.Code.RESOURCE_EXHAUSTED.value(), refused.getReleaseFailed().getError().getCode());
    assertEquals(0, stats().getClientCachedBytes());
    assertEquals(4096, stats().getLeasedBytes());
  }

  @Test
  void aMiss_reservesQuotaOnce_andHoldsItWhileTheBackendServesIt() throws Exception {
    open(OpenSessionRequest.newBuilder().setClientName("one-lease")); // session quota: one lease
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(1, 4096)).build());
    assertEquals(1, backendTasks.size(), "the miss waits for the backend executor");
    assertEquals(0, sessionInfo().getLeases(), "not served yet");
    // A second lease meanwhile finds the quota taken by the pending one, counted once: refused at
    // once (before, the miss gave its quota back on the transport thread and took it again on
    // the executor, so this one waited for the backend too).
    stream.onNext(KeepAliveRequest.newBuilder().addLeases(lease(2, 4096)).build());
    LeaseReply refused = next().getLeaseReply();
    assertEquals(2, refused.getRequestId());
    assertEquals(Status.Code.RESOURCE_EXHAUSTED.value(), refused.getError().getCode());
    assertTrue(refused.getError().getMessage().contains("max-leases=1 reached (1 leases held or in progress"),
        refused.getError().getMessage());
    runBackendTasks();
    LeaseReply served = next().getLeaseReply();
    assertEquals(1, served.getRequestId());
    assertTrue(served.hasLease(), served.toString());
    assertEquals(1, sessionInfo().getLeases());
    // The reservation became the lease, nothing left over: after a release, one lease fits again.
    stream.onNext(KeepAliveRequest.newBuilder().addReleases(StreamRelease.newBuilder().setLeaseId(
        served.getLease().getLeaseId())).addLeases(lease(3, 4096)).build());
    LeaseReply again = next().getLeaseReply();
    assertEquals(3, again.getRequestId());
    assertTrue(again.hasLease(), again.toString());
  }
}
