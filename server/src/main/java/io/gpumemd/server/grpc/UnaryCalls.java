package io.gpumemd.server.grpc;

import io.gpumemd.server.error.StatusMapper;
import io.grpc.stub.StreamObserver;
import java.util.function.Supplier;

/** How a unary call of the gRPC services is answered. Stateless and thread-safe. */
final class UnaryCalls {
  private UnaryCalls() {}

  /**
   * Answers a unary call with what {@code body} returns, or with the status its exception maps
   * to ({@link StatusMapper}). The body runs before anything is sent, so a failure never follows
   * a reply.
   */
  static <T> void answer(String rpc, StreamObserver<T> response, Supplier<T> body) {
    T value;
    try {
      value = body.get();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus(rpc, e));
      return;
    }
    response.onNext(value);
    response.onCompleted();
  }
}
