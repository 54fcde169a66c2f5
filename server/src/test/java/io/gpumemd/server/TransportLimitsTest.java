package io.gpumemd.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.gpumemd.server.config.TransportLimits;
import io.gpumemd.server.books.Validation;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.TestChannel;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.ConnectivityState;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.stub.StreamObserver;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The transport limits against a real daemon: message size (with the largest message a client
 * legitimately sends measured), connections per listener (the Unix socket answering while TCP
 * is full), concurrent calls per connection, the idle-connection timeout, and one log line in
 * the configured format for a refused request.
 */
class TransportLimitsTest {
  private static final String LEASE_ID = "0123456789abcdef0123456789abcdef";

  /**
   * The largest KeepAlive message the Java client builds: {@code NOTICES_PER_MESSAGE} (4096)
   * notices, all of them releases carrying a 64-byte CUDA IPC event handle (the largest notice),
   * plus the lease it was sent with (a 128-character tag) and counters for 64 devices.
   */
  static KeepAliveRequest largestLegitimateMessage() {
    KeepAliveRequest.Builder m = KeepAliveRequest.newBuilder().setSessionId(LEASE_ID);
    for (int i = 0; i < 4096; i++) {
      String id = String.format("%032x", i);
      m.addReleases(StreamRelease.newBuilder().setLeaseId(id).setCudaIpcEventHandle(ByteString.copyFrom(new byte[64])));
    }
    m.addLeases(StreamLease.newBuilder().setRequestId(Long.MAX_VALUE).setDevice(63).setSizeBytes(Long.MAX_VALUE)
        .setZero(true).setTag("t".repeat(Validation.MAX_LABEL_LENGTH)));
    for (int d = 0; d < 64; d++) {
      m.addClientCounters(ClientCacheCounters.newBuilder().setDevice(d).setHits(Long.MAX_VALUE).setReturns(Long.MAX_VALUE));
    }
    return m.build();
  }

  @Test
  void largestLegitimateMessage_isWellWithinTheDefault_andIsServed() throws Exception {
    KeepAliveRequest largest = largestLegitimateMessage();
    int size = largest.getSerializedSize();
    System.out.println("largest legitimate KeepAlive message: " + size + " bytes");
    assertTrue(size > 400_000 && size < 440_000, "measured " + size);
    assertTrue(size * 2 < TransportLimits.DEFAULT_MAX_MESSAGE_BYTES, "margin: " + size);
    try (TestDaemon daemon = TestDaemon.start(); TestChannel c = new TestChannel(daemon.unixTarget())) {
      String session = AllocatorGrpc.newBlockingStub(c.channel())
          .openSession(OpenSessionRequest.newBuilder().setClientName("big").build()).getSessionId();
      LinkedBlockingQueue<Object> events = new LinkedBlockingQueue<>();
      StreamObserver<KeepAliveRequest> stream = AllocatorGrpc.newStub(c.channel()).keepAlive(new StreamObserver<>() {
        @Override
        public void onNext(SessionEvent e) {
          events.add(e);
        }

        @Override
        public void onError(Throwable t) {
          events.add(t);
        }

        @Override
        public void onCompleted() {
          events.add("completed");
        }
      });
      stream.onNext(largest.toBuilder().setSessionId(session).build());
      // Served: attached, then an answer per notice (these leases do not exist) and the lease's reply.
      for (int i = 0; i < 4098; i++) {
        Object e = events.poll(10, TimeUnit.SECONDS);
        assertTrue(e instanceof SessionEvent, "event " + i + ": " + e);
      }
      stream.onCompleted();
    }
  }

  @Test
  void sessionLimits_overTheSocket_areResourceExhaustedNamingTheFlag() {
    try (TestDaemon daemon = TestDaemon.start("--max-sessions-per-tenant", "3", "--session-open-rate", "1000");
         TestChannel c = new TestChannel(daemon.unixTarget())) {
      AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(c.channel());
      for (int i = 0; i < 3; i++) {
        allocator.openSession(OpenSessionRequest.newBuilder().setClientName("s" + i).build());
      }
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> allocator.openSession(OpenSessionRequest.newBuilder().setClientName("one-too-many").build()));
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, e.getStatus().getCode());
      assertTrue(e.getStatus().getDescription().contains("3 live sessions (flag --max-sessions-per-tenant)"), e.getMessage());
      assertEquals(HealthCheckResponse.ServingStatus.SERVING,
          HealthGrpc.newBlockingStub(c.channel()).check(HealthCheckRequest.getDefaultInstance()).getStatus());
    }
  }

  @Test
  void oversizedRequest_refusedWithResourceExhausted_andOneLineInThePlainLog() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--max-message-bytes", "256KiB");
         TestChannel c = new TestChannel(daemon.unixTarget())) {
      for (int i = 0; i < 3; i++) {
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> AllocatorGrpc.newBlockingStub(c.channel())
            .openSession(OpenSessionRequest.newBuilder().setClientName("x".repeat(1 << 20)).build()));
        assertEquals(Status.Code.RESOURCE_EXHAUSTED, e.getStatus().getCode());
        assertTrue(e.getStatus().getDescription().contains("exceeds maximum size 262144"), e.getMessage());
      }
      // the daemon still serves on the same connection
      HealthGrpc.newBlockingStub(c.channel()).check(HealthCheckRequest.getDefaultInstance());
      assertTrue(daemon.awaitLine("exceeds maximum size", 5000), daemon.output());
      Thread.sleep(300);
      List<String> lines = daemon.output().lines().filter(l -> !l.startsWith("  ")).toList();
      List<String> refusals = lines.stream().filter(l -> l.contains("exceeds maximum size")).toList();
      assertEquals(3, refusals.size(), daemon.output());
      for (String line : refusals) {
        assertTrue(line.matches("\\d{4}-\\d\\d-\\d\\dT\\S+ WARN  \\[[^]]+\\] \\S+ - Request refused by the transport: .*"
            + "RESOURCE_EXHAUSTED: gRPC message exceeds maximum size 262144: \\d+ \\(the limit is --max-message-bytes\\)"), line);
      }
      assertFalse(daemon.output().contains("\tat "), "no stack trace:\n" + daemon.output());
      assertFalse(daemon.output().contains("WARNING:"), "nothing in java.util.logging's own format:\n" + daemon.output());
    }
  }

  @Test
  void oversizedRequest_isOneJsonObjectInTheJsonLog() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--log-format", "json");
         TestChannel c = new TestChannel(daemon.unixTarget())) {
      assertThrows(StatusRuntimeException.class, () -> AllocatorGrpc.newBlockingStub(c.channel())
          .openSession(OpenSessionRequest.newBuilder().setClientName("x".repeat(2 << 20)).build()));
      assertTrue(daemon.awaitLine("exceeds maximum size", 5000), daemon.output());
      Thread.sleep(300);
      for (String line : daemon.output().lines().toList()) {
        assertTrue(line.startsWith("{") && line.endsWith("}"), "not one JSON object: " + line);
      }
      String refusal = daemon.output().lines().filter(l -> l.contains("exceeds maximum size")).findFirst().orElseThrow();
      assertTrue(refusal.contains("\"level\":\"WARN\""), refusal);
      assertFalse(refusal.contains("\"throwable\":{"), "no stack trace: " + refusal);
    }
  }

  @Test
  void tcpConnectionLimit_closesExtras_whileTheUnixSocketAnswers() throws Exception {
    try (LogCapture log = new LogCapture(ConnectionLimit.class);
         TestDaemon daemon = TestDaemon.start("--tcp-max-connections", "3")) {
      List<TestChannel> channels = new ArrayList<>();
      List<Socket> silent = new ArrayList<>();
      try {
        for (int i = 0; i < 3; i++) {
          TestChannel c = new TestChannel(daemon.tcpTarget());
          channels.add(c);
          HealthGrpc.newBlockingStub(c.channel()).withDeadlineAfter(5, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance());
        }
        // Connections that send nothing at all are closed by the daemon at once.
        for (int i = 0; i < 20; i++) {
          Socket s = new Socket();
          s.connect(new InetSocketAddress("127.0.0.1", daemon.server().tcpPort()), 2000);
          s.setSoTimeout(5000);
          silent.add(s);
        }
        for (Socket s : silent) {
          try (InputStream in = s.getInputStream()) {
            assertEquals(-1, in.read(), "closed by the daemon");
          } catch (java.net.SocketException reset) {
            // closed too
          }
        }
        TestChannel fourth = new TestChannel(daemon.tcpTarget());
        channels.add(fourth);
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> HealthGrpc.newBlockingStub(fourth.channel())
            .withDeadlineAfter(2, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance()));
        assertTrue(e.getStatus().getCode() == Status.Code.UNAVAILABLE
            || e.getStatus().getCode() == Status.Code.DEADLINE_EXCEEDED, e.toString());
        // The socket is counted apart and answers.
        try (TestChannel unix = new TestChannel(daemon.unixTarget())) {
          assertEquals(HealthCheckResponse.ServingStatus.SERVING, HealthGrpc.newBlockingStub(unix.channel())
              .withDeadlineAfter(2, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance()).getStatus());
        }
        // A connection that goes frees its place.
        channels.remove(0).close();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        boolean served = false;
        while (!served && System.nanoTime() < deadline) {
          try (TestChannel again = new TestChannel(daemon.tcpTarget())) {
            HealthGrpc.newBlockingStub(again.channel()).withDeadlineAfter(1, TimeUnit.SECONDS)
                .check(HealthCheckRequest.getDefaultInstance());
            served = true;
          } catch (StatusRuntimeException retry) {
            Thread.sleep(50);
          }
        }
        assertTrue(served, "a place freed by a closed connection");
        List<String> warnings = log.messages("WARN");
        assertEquals(1, warnings.size(), "one line a minute at most: " + warnings);
        // The first refusal logs at once; refusals racing it on the other event loop may be
        // counted in that same line, so the count is 1 or a little more.
        assertTrue(warnings.get(0).matches("tcp listener: 3 live connections, the limit \\(--tcp-max-connections\\); "
            + "closed [1-9]\\d* new connection\\(s\\) since the last such line"), warnings.get(0));
      } finally {
        channels.forEach(TestChannel::close);
        for (Socket s : silent) {
          s.close();
        }
      }
    }
  }

  @Test
  void unixConnectionLimit_isItsOwn() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--unix-max-connections", "1");
         TestChannel first = new TestChannel(daemon.unixTarget());
         TestChannel second = new TestChannel(daemon.unixTarget());
         TestChannel tcp = new TestChannel(daemon.tcpTarget())) {
      HealthGrpc.newBlockingStub(first.channel()).check(HealthCheckRequest.getDefaultInstance());
      assertThrows(StatusRuntimeException.class, () -> HealthGrpc.newBlockingStub(second.channel())
          .withDeadlineAfter(2, TimeUnit.SECONDS).check(HealthCheckRequest.getDefaultInstance()));
      HealthGrpc.newBlockingStub(tcp.channel()).check(HealthCheckRequest.getDefaultInstance());
    }
  }

  @Test
  void callsPerConnection_beyondTheLimitWaitForAPlace() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--max-calls-per-connection", "2");
         TestChannel c = new TestChannel(daemon.unixTarget())) {
      List<StreamObserver<KeepAliveRequest>> streams = new ArrayList<>();
      List<CompletableFuture<SessionEvent>> attached = new ArrayList<>();
      for (int i = 0; i < 2; i++) {
        String session = AllocatorGrpc.newBlockingStub(c.channel())
            .openSession(OpenSessionRequest.newBuilder().setClientName("s" + i).build()).getSessionId();
        CompletableFuture<SessionEvent> first = new CompletableFuture<>();
        StreamObserver<KeepAliveRequest> stream = AllocatorGrpc.newStub(c.channel()).keepAlive(new StreamObserver<>() {
          @Override
          public void onNext(SessionEvent e) {
            first.complete(e);
          }

          @Override
          public void onError(Throwable t) {
            first.completeExceptionally(t);
          }

          @Override
          public void onCompleted() {}
        });
        stream.onNext(KeepAliveRequest.newBuilder().setSessionId(session).build());
        first.get(5, TimeUnit.SECONDS);
        streams.add(stream);
        attached.add(first);
      }
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> HealthGrpc.newBlockingStub(c.channel())
          .withDeadlineAfter(500, TimeUnit.MILLISECONDS).check(HealthCheckRequest.getDefaultInstance()));
      assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode(), "a third call waits for a stream");
      streams.remove(0).onCompleted();
      HealthGrpc.newBlockingStub(c.channel()).withDeadlineAfter(5, TimeUnit.SECONDS)
          .check(HealthCheckRequest.getDefaultInstance());
      streams.forEach(StreamObserver::onCompleted);
    }
  }

  @Test
  void idleConnection_isClosedAfterTheTimeout_andTheClientReconnects() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--connection-idle-timeout-seconds", "1");
         TestChannel c = new TestChannel(daemon.tcpTarget())) {
      HealthGrpc.newBlockingStub(c.channel()).check(HealthCheckRequest.getDefaultInstance());
      assertEquals(ConnectivityState.READY, c.channel().getState(false));
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (c.channel().getState(false) == ConnectivityState.READY && System.nanoTime() < deadline) {
        Thread.sleep(50);
      }
      assertEquals(ConnectivityState.IDLE, c.channel().getState(false), "the daemon closed the idle connection");
      HealthGrpc.newBlockingStub(c.channel()).check(HealthCheckRequest.getDefaultInstance());
    }
  }
}
