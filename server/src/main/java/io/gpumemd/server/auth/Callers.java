package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.Metadata;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;

/**
 * Where a call's {@link Caller} lives: on the connection (a transport attribute, set when the
 * connection is accepted) and on the call ({@link Context}, set by {@link AuthInterceptor}).
 */
public final class Callers {
  /** The connection's peer, decided when it connected; absent on an in-process transport. */
  public static final Attributes.Key<Caller> PEER = Attributes.Key.create("gpumemd.peer");
  static final Context.Key<Caller> CALL = Context.key("gpumemd.caller");

  private Callers() {}

  /**
   * An interceptor that makes every call act as {@code caller}: for in-process servers (tests,
   * embedders), whose transport identifies nobody. Never installed on a network listener.
   */
  public static ServerInterceptor fixed(Caller caller) {
    return new ServerInterceptor() {
      @Override
      public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
          ServerCallHandler<Q, R> next) {
        return Contexts.interceptCall(Context.current().withValue(CALL, caller), call, headers, next);
      }
    };
  }

  /**
   * The caller of the call running on this thread. Outside a call, or on a listener without
   * {@link AuthInterceptor} (a wiring mistake), an anonymous caller with no rights beyond its
   * own sessions: a lost identity fails closed, never as the daemon.
   */
  public static Caller current() {
    Caller caller = CALL.get();
    return caller == null ? Caller.anonymous("unidentified") : caller;
  }
}
