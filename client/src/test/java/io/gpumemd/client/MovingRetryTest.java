package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.CloseSessionResponse;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * Which answers {@link MovingRetry} calls again, and that a refused call is sent again on a
 * real (in-process) gRPC server until it is served.
 */
class MovingRetryTest {
  private static Metadata moving(String value) {
    Metadata trailers = new Metadata();
    trailers.put(MovingRetry.MOVING, value);
    return trailers;
  }

  @Test
  void onlyUnavailableWithTheMovingTrailer_isRetried() {
    assertTrue(MovingRetry.isMoving(Status.UNAVAILABLE, moving("1")));
    assertFalse(MovingRetry.isMoving(Status.UNAVAILABLE, new Metadata()), "a draining daemon: not moving");
    assertFalse(MovingRetry.isMoving(Status.UNAVAILABLE, null));
    assertFalse(MovingRetry.isMoving(Status.UNAVAILABLE, moving("0")));
    assertFalse(MovingRetry.isMoving(Status.NOT_FOUND, moving("1")));
    assertFalse(MovingRetry.isMoving(Status.OK, moving("1")));
  }

  @Test
  void backoff_doublesFrom10To100_andStopsAt30Seconds() {
    assertEquals(10, MovingRetry.backoffMillis(1));
    assertEquals(20, MovingRetry.backoffMillis(2));
    assertEquals(80, MovingRetry.backoffMillis(4));
    assertEquals(100, MovingRetry.backoffMillis(5));
    assertEquals(100, MovingRetry.backoffMillis(100));
    assertTrue(MovingRetry.retries(Status.UNAVAILABLE, moving("1"), 10, 29_000));
    assertFalse(MovingRetry.retries(Status.UNAVAILABLE, moving("1"), 10, 29_950), "past the 30 s bound");
    assertFalse(MovingRetry.retries(Status.UNAVAILABLE, new Metadata(), 0, 0));
  }

  @Test
  void theFirstRetry_goesAtOnce_whenTheSuccessorServesAlready() {
    Metadata moved = moving("1");
    moved.put(MovingRetry.MOVED, "1");
    assertEquals(0, MovingRetry.waitMillis(moved, 1), "the daemon answered after its successor served");
    assertEquals(20, MovingRetry.waitMillis(moved, 2), "refused again: back to the schedule, no spinning");
    assertEquals(10, MovingRetry.waitMillis(moving("1"), 1), "still handing over: wait");
    assertEquals(10, MovingRetry.waitMillis(null, 1));
    Metadata other = moving("1");
    other.put(MovingRetry.MOVED, "0");
    assertEquals(10, MovingRetry.waitMillis(other, 1));
  }

  @Test
  void aCallRefusedAsMovedOnce_isServedByTheNextAttempt() throws Exception {
    AtomicInteger calls = new AtomicInteger();
    String name = InProcessServerBuilder.generateName();
    Server server = serve(name, calls, (request, n) -> {
      Metadata moved = moving("1");
      moved.put(MovingRetry.MOVED, "1");
      return n <= 2 ? Status.UNAVAILABLE.withDescription("moved").asRuntimeException(moved) : null;
    });
    // A direct executor: the retry made at once runs on the answer's thread, inside its onClose.
    ManagedChannel channel = InProcessChannelBuilder.forName(name).directExecutor().intercept(new MovingRetry()).build();
    try {
      AllocatorGrpc.AllocatorBlockingStub stub = AllocatorGrpc.newBlockingStub(channel);
      assertEquals(3, stub.closeSession(CloseSessionRequest.newBuilder().setSessionId("s").build()).getReleasedLeases(),
          "served by the third attempt (the second refused as moved too, after its wait)");
    } finally {
      channel.shutdownNow();
      server.shutdownNow();
    }
  }

  @Test
  void aCallRefusedWhileMoving_isServedByTheNextAttempt() throws Exception {
    AtomicInteger calls = new AtomicInteger();
    String name = InProcessServerBuilder.generateName();
    Server server = serve(name, calls, (request, n) -> request.getSessionId().equals("draining")
        ? Status.UNAVAILABLE.withDescription("draining").asRuntimeException()
        : n <= 3 ? Status.UNAVAILABLE.withDescription("moving").asRuntimeException(moving("1")) : null);
    ManagedChannel channel = InProcessChannelBuilder.forName(name).intercept(new MovingRetry()).build();
    try {
      AllocatorGrpc.AllocatorBlockingStub stub = AllocatorGrpc.newBlockingStub(channel);
      assertEquals(4, stub.closeSession(CloseSessionRequest.newBuilder().setSessionId("s").build()).getReleasedLeases(),
          "served by the fourth attempt, the caller seeing no error");
      calls.set(100);
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> stub.closeSession(CloseSessionRequest.newBuilder().setSessionId("draining").build()));
      assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
      assertEquals(101, calls.get(), "a draining daemon's UNAVAILABLE is not retried");
    } finally {
      channel.shutdownNow();
      server.shutdownNow();
    }
  }

  /** How the in-process daemon answers CloseSession call {@code n} (1 for the first): a refusal, or null to serve it. */
  @FunctionalInterface
  private interface Answer {
    StatusRuntimeException refusal(CloseSessionRequest request, int n);
  }

  /** An in-process daemon named {@code name}: CloseSession counts its calls in {@code calls}, served with the count. */
  private static Server serve(String name, AtomicInteger calls, Answer answer) throws IOException {
    return InProcessServerBuilder.forName(name).directExecutor().addService(new AllocatorGrpc.AllocatorImplBase() {
      @Override
      public void closeSession(CloseSessionRequest request, StreamObserver<CloseSessionResponse> response) {
        int n = calls.incrementAndGet();
        StatusRuntimeException refusal = answer.refusal(request, n);
        if (refusal != null) {
          response.onError(refusal);
        } else {
          response.onNext(CloseSessionResponse.newBuilder().setReleasedLeases(n).build());
          response.onCompleted();
        }
      }
    }).build().start();
  }
}
