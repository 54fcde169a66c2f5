package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.grpc.AllocatorService;
import io.gpumemd.server.grpc.StreamWatchdog;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.testing.FakeTicker;
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
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * While a hand-over has the gate closed, the real services serve nothing and say so: a unary
 * call and a KeepAlive message are answered UNAVAILABLE with the trailer {@code gpumemd-moving:
 * 1}, unapplied (no lease made, the session's applied count unchanged); with the gate open again
 * they are served as before. While a hand-over is under way ({@link HandOverGate#closeForHandOver})
 * those answers wait for its end: "moving" when the gate opens again, and for a KeepAlive stream a
 * MovingNotice and the stream's end once the successor serves ({@link HandOverGate#moved}), still
 * unapplied.
 */
class MovingRefusalTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private final HandOverGate gate = new HandOverGate();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private Server server;
  private ManagedChannel channel;

  @BeforeEach
  void start() throws Exception {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(32 * MIB, 32 * MIB, 20 * MIB),
        sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend,
        new SessionSettings(30, 3600, 2000, 0, new Quota(0, 0), Map.of()), ticker, sessions);
    String name = InProcessServerBuilder.generateName();
    server = InProcessServerBuilder.forName(name).directExecutor()
        .addService(new AllocatorService(registry, Runnable::run,
            new ServerMetrics(new SimpleMeterRegistry(), pools, registry::sessionCount, backend),
            new StreamWatchdog(StreamWatchdog.DEFAULT_STALL_MILLIS, ticker), gate))
        .intercept(Callers.fixed(Caller.DAEMON))
        .intercept(new HandOverInterceptor(gate))
        .build().start();
    channel = InProcessChannelBuilder.forName(name).directExecutor().build();
  }

  @AfterEach
  void stop() throws Exception {
    channel.shutdownNow();
    server.shutdownNow();
    assertTrue(server.awaitTermination(5, TimeUnit.SECONDS));
    registry.endAll("test over");
    pools.close();
    backend.close();
  }

  @Test
  void closedGate_refusesUnaryCallsAndStreamMessagesUnapplied_openGateServes() throws Exception {
    AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(channel);
    String session = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("t").build()).getSessionId();
    LeaseRequest lease = LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(MIB).build();
    allocator.lease(lease);
    assertEquals(1, registry.liveLeases());

    assertEquals(0, gate.close(1000));
    StatusRuntimeException refused = assertThrows(StatusRuntimeException.class, () -> allocator.lease(lease));
    assertEquals(Status.Code.UNAVAILABLE, refused.getStatus().getCode());
    assertTrue(refused.getStatus().getDescription().contains("handing over"), refused.getStatus().toString());
    assertEquals("1", trailer(refused));
    assertNull(moved(refused), "no successor serves yet: the client waits before it calls again");
    assertEquals(1, registry.liveLeases(), "a refused call made a lease");

    KeepAliveRequest message = KeepAliveRequest.newBuilder().setSessionId(session)
        .addLeases(StreamLease.newBuilder().setRequestId(1).setDevice(0).setSizeBytes(MIB)).build();
    Throwable ended = keepAlive(message).get(10, TimeUnit.SECONDS);
    StatusRuntimeException streamRefused = (StatusRuntimeException) ended;
    assertEquals(Status.Code.UNAVAILABLE, streamRefused.getStatus().getCode());
    assertEquals("1", trailer(streamRefused));
    assertEquals(1, registry.liveLeases(), "a refused message made a lease");
    assertEquals(0, registry.session(Caller.DAEMON, session).appliedMessages(), "a refused message was counted");

    gate.open();
    allocator.lease(lease);
    assertEquals(2, registry.liveLeases());
  }

  @Test
  void handOver_holdsRefusalsUntilItEnds_movedTellsStreamsToGo() throws Exception {
    AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(channel);
    String session = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("t").build()).getSessionId();
    LinkedBlockingQueue<SessionEvent> events = new LinkedBlockingQueue<>();
    Held held = sendDuringHandOver(session, events);

    gate.moved();
    ExecutionException refused = assertThrows(ExecutionException.class, () -> held.unary().get(10, TimeUnit.SECONDS));
    StatusRuntimeException status = (StatusRuntimeException) refused.getCause();
    assertEquals(Status.Code.UNAVAILABLE, status.getStatus().getCode());
    assertEquals("1", trailer(status));
    assertEquals("1", moved(status), "the successor serves: the client may call again at once");
    assertTrue(held.stream().get(10, TimeUnit.SECONDS) instanceof Completed, "the stream ended otherwise");
    assertEquals(List.of(SessionEvent.EventCase.MOVING), events.stream().map(SessionEvent::getEventCase).toList());
    assertEquals(0, registry.liveLeases(), "a held request made a lease");
    assertEquals(0, registry.session(Caller.DAEMON, session).appliedMessages(), "a held message was counted");
    // The hand-over is over: what comes now is refused at once, and goes to the successor at once.
    StatusRuntimeException after = assertThrows(StatusRuntimeException.class, () -> allocator.lease(leaseOf(session)));
    assertEquals("1", trailer(after));
    assertEquals("1", moved(after));
  }

  @Test
  void handOverGivenUp_answersHeldRequestsMoving_thenServes() throws Exception {
    AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(channel);
    String session = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("t").build()).getSessionId();
    Held held = sendDuringHandOver(session, new LinkedBlockingQueue<>());

    gate.open();
    ExecutionException refused = assertThrows(ExecutionException.class, () -> held.unary().get(10, TimeUnit.SECONDS));
    assertEquals("1", trailer((StatusRuntimeException) refused.getCause()));
    assertNull(moved((StatusRuntimeException) refused.getCause()), "nothing moved: the call comes back here");
    assertEquals("1", trailer((StatusRuntimeException) held.stream().get(10, TimeUnit.SECONDS)));
    assertEquals(0, registry.liveLeases(), "a held request made a lease");
    allocator.lease(leaseOf(session));
    assertEquals(1, registry.liveLeases());
  }

  /** A unary Lease and a KeepAlive stream's first message, both held by a gate closed for a hand-over. */
  private record Held(Future<LeaseResponse> unary, CompletableFuture<Throwable> stream) {}

  /** Closes the gate for a hand-over, then sends a Lease and a KeepAlive message of {@code session}. */
  private Held sendDuringHandOver(String session, LinkedBlockingQueue<SessionEvent> events) throws Exception {
    assertEquals(0, gate.closeForHandOver(1000));
    // In-process with direct executors: each request has reached the gate when the call returns.
    Future<LeaseResponse> unary = AllocatorGrpc.newFutureStub(channel).lease(leaseOf(session));
    CompletableFuture<Throwable> stream = keepAlive(KeepAliveRequest.newBuilder().setSessionId(session)
        .addLeases(StreamLease.newBuilder().setRequestId(1).setDevice(0).setSizeBytes(MIB)).build(), events);
    assertFalse(unary.isDone(), "a call was answered during the hand-over");
    assertFalse(stream.isDone(), "a stream was answered during the hand-over");
    return new Held(unary, stream);
  }

  private static LeaseRequest leaseOf(String session) {
    return LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(MIB).build();
  }

  private static String trailer(StatusRuntimeException e) {
    Metadata trailers = e.getTrailers();
    assertNotNull(trailers, "no trailers");
    return trailers.get(HandOverInterceptor.MOVING);
  }

  private static String moved(StatusRuntimeException e) {
    return e.getTrailers().get(HandOverInterceptor.MOVED);
  }

  /** How a stream that completed ends, in {@link #keepAlive}'s future. */
  private static final class Completed extends Throwable {
    Completed(String events) {
      super("the stream completed; events: " + events);
    }
  }

  /** Sends one message on a new KeepAlive stream; completes with how the stream ended. */
  private CompletableFuture<Throwable> keepAlive(KeepAliveRequest message) {
    return keepAlive(message, new LinkedBlockingQueue<>());
  }

  private CompletableFuture<Throwable> keepAlive(KeepAliveRequest message, LinkedBlockingQueue<SessionEvent> events) {
    CompletableFuture<Throwable> ended = new CompletableFuture<>();
    StreamObserver<KeepAliveRequest> requests = AllocatorGrpc.newStub(channel).keepAlive(new StreamObserver<>() {
      @Override
      public void onNext(SessionEvent event) {
        events.add(event);
      }

      @Override
      public void onError(Throwable t) {
        ended.complete(t);
      }

      @Override
      public void onCompleted() {
        ended.complete(new Completed(String.valueOf(events)));
      }
    });
    requests.onNext(message);
    return ended;
  }
}
