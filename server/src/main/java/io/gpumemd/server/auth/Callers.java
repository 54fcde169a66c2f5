package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.Context;

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
   * The caller of the call running on this thread. Outside a call, or on a listener without
   * {@link AuthInterceptor} (a wiring mistake), an anonymous caller with no rights beyond its
   * own sessions: a lost identity fails closed, never as the daemon.
   */
  public static Caller current() {
    Caller caller = CALL.get();
    return caller == null ? Caller.anonymous("unidentified") : caller;
  }
}
