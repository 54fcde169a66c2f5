package io.gpumemd.server.auth;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListDevicesRequest;
import io.gpumemd.proto.v1.ListDevicesResponse;
import io.grpc.stub.StreamObserver;

import io.gpumemd.server.testing.FakeTicker;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.protobuf.services.HealthStatusManager;
import io.grpc.stub.MetadataUtils;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Who a call is, decided per call. An in-process transport has no {@link Callers#PEER}: its
 * peers are unidentified, like remote TCP peers without a certificate, which is the case this
 * exercises (the identified cases run against real listeners in the client module's tests).
 */
class AuthInterceptorTest {
  private static final String TOKEN = "team-a-token-0123456789";

  @TempDir
  Path dir;
  private Server server;
  private ManagedChannel channel;
  private final AtomicReference<Caller> seen = new AtomicReference<>();

  private HealthGrpc.HealthBlockingStub start(AuthInterceptor auth, String authorization) {
    String name = "auth-" + System.nanoTime();
    ServerInterceptor capture = new ServerInterceptor() {
      @Override
      public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
        seen.set(Callers.current());
        return next.startCall(call, headers);
      }
    };
    HealthStatusManager health = new HealthStatusManager();
    AdminGrpc.AdminImplBase admin = new AdminGrpc.AdminImplBase() {
      @Override
      public void listDevices(ListDevicesRequest request, StreamObserver<ListDevicesResponse> response) {
        response.onNext(ListDevicesResponse.getDefaultInstance());
        response.onCompleted();
      }
    };
    try {
      // the last interceptor added runs first: auth, then the capture
      server = InProcessServerBuilder.forName(name).directExecutor().addService(health.getHealthService())
          .addService(admin)
          .intercept(capture).intercept(auth).build().start();
    } catch (java.io.IOException e) {
      throw new AssertionError(e);
    }
    channel = InProcessChannelBuilder.forName(name).directExecutor().build();
    HealthGrpc.HealthBlockingStub stub = HealthGrpc.newBlockingStub(channel);
    if (authorization != null) {
      Metadata headers = new Metadata();
      headers.put(AuthInterceptor.AUTHORIZATION, authorization);
      stub = stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    return stub;
  }

  @AfterEach
  void stop() {
    channel.shutdownNow();
    server.shutdownNow();
  }

  private BearerTokens tokens() throws Exception {
    Path file = Files.writeString(dir.resolve("tokens"), TOKEN + " team-a\n");
    return BearerTokens.load(file, new FakeTicker());
  }

  private static HealthCheckRequest check() {
    return HealthCheckRequest.getDefaultInstance();
  }

  @Test
  void unidentifiedPeer_withoutInsecureTcp_getsHealthOnly() {
    HealthGrpc.HealthBlockingStub stub = start(new AuthInterceptor(null, false), null);
    stub.check(check()); // health: allowed, as anonymous
    assertEquals("anonymous", seen.get().tenant());
    seen.set(null);
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
        () -> AdminGrpc.newBlockingStub(channel).listDevices(ListDevicesRequest.getDefaultInstance()));
    assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
    assertTrue(e.getStatus().getDescription().startsWith("unidentified peer "), e.getStatus().getDescription());
    assertTrue(e.getStatus().getDescription().endsWith(": present a bearer token (authorization: Bearer …) or a "
        + "client certificate; this daemon does not run with --insecure-tcp"), e.getStatus().getDescription());
    assertEquals(null, seen.get(), "no handler ran");
  }

  @Test
  void unidentifiedPeer_withInsecureTcp_isAnonymous() {
    start(new AuthInterceptor(null, true), null);
    AdminGrpc.newBlockingStub(channel).listDevices(ListDevicesRequest.getDefaultInstance());
    assertEquals("anonymous", seen.get().tenant());
    assertEquals(false, seen.get().admin());
  }

  @Test
  void validToken_actsAsItsTenant_evenOnAnUnidentifiedConnection() throws Exception {
    start(new AuthInterceptor(tokens(), false), "Bearer " + TOKEN).check(check());
    Caller c = seen.get();
    assertEquals("token:team-a", c.tenant());
    assertEquals("token 'team-a'", c.principal());
    assertEquals(false, c.admin());
  }

  @Test
  void unknownToken_isUnauthenticated_andNoHandlerRuns() throws Exception {
    HealthGrpc.HealthBlockingStub stub = start(new AuthInterceptor(tokens(), true), "Bearer " + TOKEN + "x");
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> stub.check(check()));
    assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
    assertEquals("unknown bearer token", e.getStatus().getDescription());
    assertEquals(null, seen.get(), "nothing ran");
  }

  @Test
  void tokenOnADaemonWithoutTokens_saysSo() {
    HealthGrpc.HealthBlockingStub stub = start(new AuthInterceptor(null, true), "Bearer " + TOKEN);
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> stub.check(check()));
    assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
    assertEquals("bearer tokens are not enabled on this daemon (it runs without --tokens-file)",
        e.getStatus().getDescription());
  }

  @Test
  void otherAuthorizationScheme_isUnauthenticated() throws Exception {
    HealthGrpc.HealthBlockingStub stub = start(new AuthInterceptor(tokens(), true), "Basic dXNlcjpwYXNz");
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> stub.check(check()));
    assertEquals("authorization: scheme 'basic' (expected: 'Bearer <token>')", e.getStatus().getDescription());
  }
}
