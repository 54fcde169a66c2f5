package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.Grpc;
import io.grpc.Metadata;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.Status;
import java.net.InetSocketAddress;
import java.net.SocketAddress;

/**
 * Decides the {@link Caller} of every call and makes it {@link Callers#current()} for the
 * call's handlers: the connection's kernel-vouched peer ({@link Callers#PEER}), else anonymous.
 *
 * <p>Thread-safety: stateless; runs on the transport thread at the start of each call.
 */
public final class AuthInterceptor implements ServerInterceptor {
  /**
   * Makes every call act as {@code caller}: for in-process servers (embedding, tests), whose
   * transport has no peer the kernel could vouch for.
   */
  public static ServerInterceptor fixed(Caller caller) {
    return new ServerInterceptor() {
      @Override
      public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
          ServerCallHandler<Q, R> next) {
        return Contexts.interceptCall(Context.current().withValue(Callers.CALL, caller), call, headers, next);
      }
    };
  }

  @Override
  public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
    Caller caller;
    try {
      caller = callerOf(call.getAttributes(), headers);
    } catch (io.grpc.StatusRuntimeException e) {
      call.close(e.getStatus(), new Metadata());
      return new ServerCall.Listener<>() {};
    }
    return Contexts.interceptCall(Context.current().withValue(Callers.CALL, caller), call, headers, next);
  }

  private Caller callerOf(Attributes attributes, Metadata headers) {
    Caller peer = attributes.get(Callers.PEER);
    if (peer != null) {
      return peer;
    }
    return Caller.anonymous(describe(attributes.get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR)));
  }

  private static String describe(SocketAddress remote) {
    return remote instanceof InetSocketAddress inet ? LoopbackPeers.hostPort(inet) : String.valueOf(remote);
  }

  static Status unauthenticated(String why) {
    return Status.UNAUTHENTICATED.withDescription(why);
  }
}
