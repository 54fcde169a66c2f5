package io.gpumemd.it.tenancy;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.ListObjectsRequest;
import io.gpumemd.proto.v1.LookupRequest;
import io.gpumemd.proto.v1.RemoveObjectRequest;
import io.gpumemd.proto.v1.UnpublishRequest;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.SetRetentionCapRequest;
import io.gpumemd.proto.v1.TrimRequest;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.nio.ByteBuffer;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Supplier;

/**
 * What a second user tries against someone else's session: run by {@link TenancyTest} as
 * another uid. Prints one {@code RESULT} line with, for each attempt, {@code OK} or the gRPC
 * status code it got, and what its own lease looked like.
 *
 * <p>Usage: {@code TenantProbeMain target victimSessionId victimLeaseId leaseBytes action[,action...]}
 * with actions own, list, lease, release, attach, attachLoop, close, trim, cap, and for sharing
 * (victimLeaseId then carries a share token) attachToken, lookup, unpublish, objects,
 * removeObject, which name the object {@value #OBJECT}.
 */
public final class TenantProbeMain {
  /** The object name the sharing actions try. */
  static final String OBJECT = "victim/weights";

  private TenantProbeMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    String victimSession = args[1];
    String victimLease = args[2];
    long leaseBytes = Long.parseLong(args[3]);
    Map<String, String> result = new LinkedHashMap<>();
    GpuMemClient connected;
    try {
      connected = GpuMemClient.builder(target).clientName("probe").clientCacheBytes(0).connect();
      result.put("connect", "OK");
    } catch (RuntimeException e) {
      System.out.println("RESULT connect=" + e.getMessage().replaceAll("\\s+", "_"));
      return;
    }
    try (GpuMemClient own = connected) {
      ManagedChannel channel = own.connection().channel();
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(channel).withDeadlineAfter(20, TimeUnit.SECONDS);
      AllocatorGrpc.AllocatorBlockingStub allocator =
          AllocatorGrpc.newBlockingStub(channel).withDeadlineAfter(20, TimeUnit.SECONDS);
      for (String action : args[4].split(",")) {
        switch (action) {
          case "own" -> ownLease(own, leaseBytes, result);
          case "manySessions" -> manySessions(target, leaseBytes, result);
          case "list" -> {
            var sessions = admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList();
            result.put("sessionsSeen", Integer.toString(sessions.size()));
            result.put("victimSeen", Boolean.toString(sessions.stream().map(SessionInfo::getSessionId)
                .anyMatch(victimSession::equals)));
            result.put("ownTenant", sessions.stream().filter(x -> x.getSessionId().equals(own.sessionId()))
                .map(SessionInfo::getTenant).findFirst().orElse("none"));
            result.put("foreignLeasesSeen", Long.toString(admin.listLeases(ListLeasesRequest.getDefaultInstance())
                .getLeasesList().stream().filter(l -> !l.getSessionId().equals(own.sessionId())).count()));
            result.put("victimLeasesSeen", Integer.toString(admin.listLeases(
                ListLeasesRequest.newBuilder().setSessionId(victimSession).build()).getLeasesCount()));
          }
          case "lease" -> result.put("lease", status(() -> allocator.lease(LeaseRequest.newBuilder()
              .setSessionId(victimSession).setDevice(0).setSizeBytes(4096).build())));
          case "release" -> result.put("release", status(() -> allocator.release(ReleaseRequest.newBuilder()
              .setSessionId(victimSession).setLeaseId(victimLease).build())));
          case "attach" -> result.put("attach", attach(channel, victimSession));
          case "attachLoop" -> {
            // An intruder that keeps trying for three seconds: every outcome it saw.
            java.util.Set<String> seen = new java.util.TreeSet<>();
            long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(3);
            System.out.println("TRYING");
            System.out.flush();
            while (System.nanoTime() < end) {
              seen.add(attach(channel, victimSession));
            }
            result.put("attachLoop", String.join("+", seen));
          }
          case "close" -> result.put("close", status(() -> allocator.closeSession(CloseSessionRequest.newBuilder()
              .setSessionId(victimSession).build())));
          case "trim" -> result.put("trim", status(() -> admin.trim(TrimRequest.newBuilder().setKeepBytes(0).build())));
          case "cap" -> result.put("cap", status(() -> admin.setRetentionCap(
              SetRetentionCapRequest.newBuilder().setCapBytes(0).build())));
          case "attachToken" -> result.put("attachToken", status(() -> allocator.attach(AttachRequest.newBuilder()
              .setSessionId(own.sessionId()).setToken(victimLease).build())));
          case "lookup" -> result.put("lookup", status(() -> allocator.lookup(LookupRequest.newBuilder()
              .setSessionId(own.sessionId()).setName(OBJECT).build())));
          case "unpublish" -> result.put("unpublish", status(() -> allocator.unpublish(UnpublishRequest.newBuilder()
              .setSessionId(own.sessionId()).setName(OBJECT).build())));
          case "objects" -> result.put("objectsSeen", Integer.toString(
              admin.listObjects(ListObjectsRequest.getDefaultInstance()).getObjectsCount()));
          case "removeObject" -> result.put("removeObject", status(() -> admin.removeObject(
              RemoveObjectRequest.newBuilder().setTenant("uid:0").setName(OBJECT).build())));
          default -> throw new IllegalArgumentException("unknown action " + action);
        }
      }
    }
    StringBuilder line = new StringBuilder("RESULT");
    result.forEach((k, v) -> line.append(' ').append(k).append('=').append(v));
    System.out.println(line);
  }

  /** Eight more sessions of this process, one lease each: how many the tenant quota grants. */
  private static void manySessions(String target, long leaseBytes, Map<String, String> result) {
    java.util.List<GpuMemClient> clients = new java.util.ArrayList<>();
    int granted = 0;
    try {
      for (int i = 0; i < 8; i++) {
        GpuMemClient client = GpuMemClient.builder(target).clientName("many-" + i).clientCacheBytes(0).connect();
        clients.add(client);
        try {
          client.lease(0, leaseBytes, false, "quota");
          granted++;
        } catch (io.gpumemd.client.GpuMemException e) {
          result.put("refusal", e.code().name());
        }
      }
    } finally {
      clients.forEach(GpuMemClient::close);
    }
    result.put("leasesGranted", Integer.toString(granted));
  }

  /** Its own lease: mappable by this user, and nothing of anyone else's in it. */
  private static void ownLease(GpuMemClient own, long leaseBytes, Map<String, String> result) {
    try (Lease lease = own.lease(0, leaseBytes, false, "probe")) {
      ByteBuffer bytes = lease.buffer();
      boolean zero = true;
      for (int i = 0; i < bytes.capacity(); i++) {
        zero &= bytes.get(i) == 0;
      }
      bytes.put(0, (byte) 0x5a);
      result.put("ownLease", "OK");
      result.put("ownZero", Boolean.toString(zero));
      result.put("ownSegment", Long.toString(lease.segmentId()));
    } catch (RuntimeException e) {
      result.put("ownLease", e.toString().replaceAll("\\s+", "_"));
    }
  }

  /** {@code OK}, or the status code the call ended with. */
  private static String status(Supplier<?> call) {
    try {
      call.get();
      return "OK";
    } catch (StatusRuntimeException e) {
      return e.getStatus().getCode().name();
    }
  }

  /**
   * Opens a KeepAlive stream naming the victim's session: {@code OK} when the daemon attaches
   * it, else the status that ended the stream.
   */
  static String attach(ManagedChannel channel, String sessionId) throws Exception {
    CompletableFuture<String> outcome = new CompletableFuture<>();
    StreamObserver<KeepAliveRequest> requests = AllocatorGrpc.newStub(channel).keepAlive(new StreamObserver<>() {
      @Override
      public void onNext(SessionEvent event) {
        if (event.hasAttached()) {
          outcome.complete("OK");
        }
      }

      @Override
      public void onError(Throwable t) {
        outcome.complete(t instanceof StatusRuntimeException e ? e.getStatus().getCode().name() : t.toString());
      }

      @Override
      public void onCompleted() {
        outcome.complete("COMPLETED");
      }
    });
    requests.onNext(KeepAliveRequest.newBuilder().setSessionId(sessionId).build());
    try {
      return outcome.get(10, TimeUnit.SECONDS);
    } catch (TimeoutException e) {
      return "NO_ANSWER";
    } finally {
      requests.onCompleted();
    }
  }
}
