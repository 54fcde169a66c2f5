package io.gpumemd.it.hardening;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.StreamLease;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The counter attack of issue 22, as a hostile tenant runs it with a raw gRPC client (no
 * {@code GpuMemClient}): opens sessions, and on each one's KeepAlive stream reports client
 * cache counters of {@code value} (hits and returns) for devices 0 and 1. A stream lease sent
 * in the next message on the same stream is answered only after the counters were applied
 * (the daemon reads a stream's messages in order), so when this prints its {@code RESULT} line
 * the daemon has taken every report. Then it reads its own sessions' figures and closes them.
 *
 * <p>Usage: {@code CounterOverflowMain target sessions value}. Prints {@code RESULT applied=N
 * ownHits=H,H ownReturns=R,R} (its sessions' client_cache_hits/returns in ListSessions).
 */
public final class CounterOverflowMain {
  private CounterOverflowMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    int sessions = Integer.parseInt(args[1]);
    long value = Long.parseLong(args[2]);
    try (Channels.Connection connection = Channels.open(target)) {
      AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(connection.channel())
          .withDeadlineAfter(20, TimeUnit.SECONDS);
      List<String> ids = new ArrayList<>();
      List<StreamObserver<KeepAliveRequest>> streams = new ArrayList<>();
      int applied = 0;
      for (int i = 0; i < sessions; i++) {
        String id = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("counters-" + i).build())
            .getSessionId();
        ids.add(id);
        LinkedBlockingQueue<Object> events = new LinkedBlockingQueue<>();
        StreamObserver<KeepAliveRequest> stream = AllocatorGrpc.newStub(connection.channel()).keepAlive(events(events));
        streams.add(stream);
        KeepAliveRequest.Builder report = KeepAliveRequest.newBuilder().setSessionId(id);
        for (int device = 0; device < 2; device++) {
          report.addClientCounters(ClientCacheCounters.newBuilder().setDevice(device).setHits(value).setReturns(value));
        }
        stream.onNext(report.build());
        stream.onNext(KeepAliveRequest.newBuilder()
            .addLeases(StreamLease.newBuilder().setRequestId(1).setDevice(0).setSizeBytes(4096)).build());
        if (awaitLeaseReply(events)) {
          applied++;
        }
      }
      List<String> hits = new ArrayList<>();
      List<String> returns = new ArrayList<>();
      for (SessionInfo s : AdminGrpc.newBlockingStub(connection.channel()).withDeadlineAfter(20, TimeUnit.SECONDS)
          .listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList()) {
        if (ids.contains(s.getSessionId())) {
          hits.add(Long.toString(s.getClientCacheHits()));
          returns.add(Long.toString(s.getClientCacheReturns()));
        }
      }
      for (int i = 0; i < sessions; i++) {
        allocator.closeSession(CloseSessionRequest.newBuilder().setSessionId(ids.get(i)).build());
        streams.get(i).onCompleted();
      }
      System.out.println("RESULT applied=" + applied + " ownHits=" + String.join(",", hits)
          + " ownReturns=" + String.join(",", returns));
    }
  }

  /** True once the stream's lease reply came (after the attach event), false on an error or timeout. */
  private static boolean awaitLeaseReply(LinkedBlockingQueue<Object> events) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (System.nanoTime() < deadline) {
      Object e = events.poll(100, TimeUnit.MILLISECONDS);
      if (e instanceof SessionEvent event && event.hasLeaseReply()) {
        return true;
      }
      if (e != null && !(e instanceof SessionEvent)) {
        System.out.println("stream ended: " + e);
        return false;
      }
    }
    System.out.println("no lease reply within 20 s");
    return false;
  }

  private static StreamObserver<SessionEvent> events(LinkedBlockingQueue<Object> events) {
    return new StreamObserver<>() {
      @Override
      public void onNext(SessionEvent event) {
        events.add(event);
      }

      @Override
      public void onError(Throwable t) {
        events.add(t);
      }

      @Override
      public void onCompleted() {
        events.add("completed");
      }
    };
  }
}
