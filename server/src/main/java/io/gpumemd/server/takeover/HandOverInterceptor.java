package io.gpumemd.server.takeover;

import io.grpc.ForwardingServerCall.SimpleForwardingServerCall;
import io.grpc.ForwardingServerCallListener.SimpleForwardingServerCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor.MethodType;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.Status;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * Runs every unary call of the gpumemd services through the {@link HandOverGate}: while a
 * hand-over has the gate closed, a call is answered UNAVAILABLE with the trailer {@code
 * gpumemd-moving: 1} before its handler runs, so the client knows it was not served and calls
 * again (it reaches the successor); while a hand-over is under way that answer waits for its end
 * ({@link HandOverGate#hold}), so that the call made again finds the successor serving; once
 * the successor serves ({@link HandOverGate#moved}) the answer also carries {@code gpumemd-moved:
 * 1}, and the client calls again at once instead of after its first retry's wait. A call
 * let in counts as in flight until its handler closes it, also after the client cancelled it: a
 * miss may still be recording its lease then. Health, reflection and the KeepAlive stream pass untouched (the stream's messages
 * go through the gate one by one in {@link io.gpumemd.server.grpc.SessionStream}).
 *
 * <p>Thread-safe; stateless beyond the gate.
 */
public final class HandOverInterceptor implements ServerInterceptor {
  /** The trailer that marks a call refused because the daemon is moving. */
  public static final Metadata.Key<String> MOVING = Metadata.Key.of("gpumemd-moving", Metadata.ASCII_STRING_MARSHALLER);
  /**
   * The trailer added to {@link #MOVING} once the successor serves: call again now. A client
   * that does not know it retries after its usual first wait (10 ms), as before.
   */
  public static final Metadata.Key<String> MOVED = Metadata.Key.of("gpumemd-moved", Metadata.ASCII_STRING_MARSHALLER);

  private final HandOverGate gate;

  public HandOverInterceptor(HandOverGate gate) {
    this.gate = gate;
  }

  /** The status a call refused by a closed gate gets. */
  public static Status movingStatus() {
    return Status.UNAVAILABLE.withDescription(
        "gpumemd is handing over to its successor; this call was not served: call again");
  }

  /** Trailers marking a refusal as a hand-over's. */
  public static Metadata movingTrailers() {
    return movingTrailers(false);
  }

  /** Trailers marking a refusal as a hand-over's; {@code moved}: the successor serves already. */
  public static Metadata movingTrailers(boolean moved) {
    Metadata trailers = new Metadata();
    trailers.put(MOVING, "1");
    if (moved) {
      trailers.put(MOVED, "1");
    }
    return trailers;
  }

  @Override
  public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
      ServerCallHandler<Q, R> next) {
    if (call.getMethodDescriptor().getType() != MethodType.UNARY
        || !String.valueOf(call.getMethodDescriptor().getServiceName()).startsWith("gpumemd.v1.")) {
      return next.startCall(call, headers);
    }
    GatedCall<Q, R> gated = new GatedCall<>(call, gate);
    return new SimpleForwardingServerCallListener<>(next.startCall(gated, headers)) {
      @Override
      public void onHalfClose() {
        // A unary handler runs here, once the request has arrived.
        if (!gate.enter()) {
          // Answered "moving" at once, or when the hand-over ends (the client calls again then).
          if (!gate.hold(gated::refuse)) {
            gated.refuse(gate.movedAway());
          }
          return;
        }
        gated.entered.set(true);
        super.onHalfClose();
      }


    };
  }

  /** A call that leaves the gate once, when its handler closes it. */
  private static final class GatedCall<Q, R> extends SimpleForwardingServerCall<Q, R> {
    private final HandOverGate gate;
    final AtomicBoolean entered = new AtomicBoolean();
    private volatile boolean refused;

    GatedCall(ServerCall<Q, R> call, HandOverGate gate) {
      super(call);
      this.gate = gate;
    }

    void refuse(boolean moved) {
      refused = true;
      super.close(movingStatus(), movingTrailers(moved));
    }

    void leave() {
      if (entered.compareAndSet(true, false)) {
        gate.exit();
      }
    }

    @Override
    public void close(Status status, Metadata trailers) {
      if (refused) {
        return; // the handler may still answer a call the gate refused; it already has its answer
      }
      try {
        super.close(status, trailers);
      } finally {
        leave();
      }
    }
  }
}
