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
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthGrpc;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.Locale;

/**
 * Decides the {@link Caller} of every call and makes it {@link Callers#current()} for the
 * call's handlers, in this order:
 *
 * <ol>
 *   <li>an {@code authorization: Bearer <token>} header: the token's tenant ({@code
 *       token:<TENANT>}) and role from {@code --tokens-file}. A header that is not a valid token
 *       ends the call with UNAUTHENTICATED before any handler runs, even where the connection
 *       itself is identified: a caller that sends a credential means to use it;
 *   <li>the connection's peer ({@link Callers#PEER}): the Unix socket's SO_PEERCRED, a client
 *       certificate, or the owner of a loopback TCP socket;
 *   <li>otherwise the peer is unidentified (a remote TCP peer without token or certificate). It
 *       acts as the shared {@link Caller#anonymous anonymous} tenant only under
 *       {@code --insecure-tcp}; else its calls are UNAUTHENTICATED, except health checks, which
 *       reveal nothing and serve load balancers.
 * </ol>
 *
 * <p>Thread-safety: immutable (the token table reloads itself safely); runs on the transport
 * thread at the start of each call.
 */
public final class AuthInterceptor implements ServerInterceptor {
  static final Metadata.Key<String> AUTHORIZATION = Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
  private static final String BEARER = "bearer ";

  /** Null when the daemon has no {@code --tokens-file}. */
  private final BearerTokens tokens;
  private final boolean anonymousAllowed;

  /**
   * @param tokens the bearer tokens, or null when none are configured
   * @param anonymousAllowed {@code --insecure-tcp}: unidentified peers act as 'anonymous'
   */
  public AuthInterceptor(BearerTokens tokens, boolean anonymousAllowed) {
    this.tokens = tokens;
    this.anonymousAllowed = anonymousAllowed;
  }

  @Override
  public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
    Caller caller;
    try {
      caller = callerOf(call, headers);
    } catch (StatusRuntimeException e) {
      call.close(e.getStatus(), new Metadata());
      return new ServerCall.Listener<>() {};
    }
    return Contexts.interceptCall(Context.current().withValue(Callers.CALL, caller), call, headers, next);
  }

  private Caller callerOf(ServerCall<?, ?> call, Metadata headers) {
    Attributes attributes = call.getAttributes();
    Caller peer = attributes.get(Callers.PEER);
    String remote = describe(attributes.get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR));
    String authorization = headers.get(AUTHORIZATION);
    if (authorization != null) {
      return tokenCaller(authorization, peer != null ? peer.origin() : "tcp " + remote);
    }
    if (peer != null) {
      return peer;
    }
    if (anonymousAllowed || HealthGrpc.SERVICE_NAME.equals(call.getMethodDescriptor().getServiceName())) {
      return Caller.anonymous(remote);
    }
    throw unauthenticated("unidentified peer " + remote + ": present a bearer token (authorization: Bearer …) "
        + "or a client certificate; this daemon does not run with --insecure-tcp").asRuntimeException();
  }

  private Caller tokenCaller(String authorization, String origin) {
    if (!authorization.regionMatches(true, 0, BEARER, 0, BEARER.length())) {
      String scheme = authorization.split(" ", 2)[0];
      throw unauthenticated("authorization: scheme '" + scheme.toLowerCase(Locale.ROOT)
          + "' (expected: 'Bearer <token>')").asRuntimeException();
    }
    if (tokens == null) {
      throw unauthenticated("bearer tokens are not enabled on this daemon (it runs without --tokens-file)")
          .asRuntimeException();
    }
    BearerTokens.Grant grant = tokens.lookup(authorization.substring(BEARER.length()).trim());
    if (grant == null) {
      throw unauthenticated("unknown bearer token").asRuntimeException();
    }
    return new Caller("token:" + grant.tenant(), "token '" + grant.tenant() + "'", grant.admin(),
        Caller.UNKNOWN, Caller.UNKNOWN, Caller.UNKNOWN, origin);
  }

  private static String describe(SocketAddress remote) {
    return remote instanceof InetSocketAddress inet ? LoopbackPeers.hostPort(inet) : String.valueOf(remote);
  }

  static Status unauthenticated(String why) {
    return Status.UNAUTHENTICATED.withDescription(why);
  }
}
