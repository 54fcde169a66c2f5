package io.gpumemd.it.tenancy;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.RemoveShareRequest;
import io.grpc.StatusRuntimeException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * A tenant's process for {@link TenantHoldsAndSharesTest}, run as another uid: it takes holds
 * until its tenant's bound, or shares a block and tries another tenant's tokens; in between it
 * prints a line ({@code HOLDING}, {@code SHARED ...}) and waits for one on stdin, so that the test
 * acts while it holds. Prints one {@code RESULT key=value ...} line at the end.
 *
 * <p>Usage: {@code HoldsAndSharesProbeMain target holds} or {@code HoldsAndSharesProbeMain target
 * shares victimShareId}.
 */
public final class HoldsAndSharesProbeMain {
  private static final BufferedReader STDIN = new BufferedReader(new InputStreamReader(System.in,
      StandardCharsets.UTF_8));

  private HoldsAndSharesProbeMain() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> result = new LinkedHashMap<>();
    switch (args[1]) {
      case "holds" -> holds(args[0], result);
      case "shares" -> shares(args[0], args[2], result);
      default -> throw new IllegalArgumentException("unknown mode " + args[1]);
    }
    StringBuilder line = new StringBuilder("RESULT");
    result.forEach((k, v) -> line.append(' ').append(k).append('=').append(v));
    System.out.println(line);
  }

  /** Unary calls: a closed hold is released when close() returns (the stream's release is a notice). */
  private static GpuMemClient connect(String target, String name) {
    return GpuMemClient.builder(target).clientName(name).clientCacheBytes(0).unaryCalls(true).connect();
  }

  /**
   * Attaches from two sessions until the tenant's bound refuses; waits; then shows that a
   * released hold and an ended session each give their places back.
   */
  private static void holds(String target, Map<String, String> result) throws Exception {
    List<GpuMemClient> clients = new ArrayList<>();
    try (GpuMemClient producer = connect(target, "producer");
         Lease lease = producer.lease(0, 4096)) {
      String token = lease.share().token();
      GpuMemClient first = connect(target, "reader-1");
      GpuMemClient second = connect(target, "reader-2");
      clients.addAll(List.of(first, second));
      List<Lease> holds = new ArrayList<>();
      long secondsHolds = 0;
      for (int i = 0; i < 100; i++) {
        try {
          holds.add((i % 2 == 0 ? first : second).attach(token));
          secondsHolds += i % 2;
        } catch (GpuMemException e) {
          result.put("refusal", e.code().name());
          result.put("refusalNamesTenantAndFlag", Boolean.toString(e.serverMessage().contains("tenant uid:")
              && e.serverMessage().contains("(flag --max-holds-per-tenant)")));
          break;
        }
      }
      result.put("holdsGranted", Integer.toString(holds.size()));
      System.out.println("HOLDING");
      System.out.flush();
      STDIN.readLine();
      holds.remove(0).close();
      result.put("afterRelease", status(() -> holds.add(first.attach(token))));
      result.put("beyondAgain", status(() -> second.attach(token)));
      second.close();
      GpuMemClient third = connect(target, "reader-3");
      clients.add(third);
      int regained = 0;
      for (long i = 0; i < secondsHolds; i++) {
        if ("OK".equals(status(() -> third.attach(token)))) {
          regained++;
        }
      }
      result.put("afterSessionEnd", regained + "/" + secondsHolds);
      result.put("beyondThird", status(() -> third.attach(token)));
    } finally {
      clients.forEach(GpuMemClient::close);
    }
  }

  /**
   * Shares a block (its lease released: the token and a second session's hold keep it), tries
   * another tenant's token through the Admin verbs, waits, then attaches with its own token.
   */
  private static void shares(String target, String victimShareId, Map<String, String> result) throws Exception {
    try (GpuMemClient producer = connect(target, "producer");
         GpuMemClient holder = connect(target, "holder")) {
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(producer.connection().channel())
          .withDeadlineAfter(20, TimeUnit.SECONDS);
      Lease lease = producer.lease(0, 4096);
      String token = lease.share().token();
      Lease hold = holder.attach(token);
      String leaseId = lease.id();
      lease.close();
      result.put("listVictims", status(() -> admin.listShares(ListSharesRequest.newBuilder().setTenant("uid:0")
          .build())));
      ListSharesResponse own = admin.listShares(ListSharesRequest.getDefaultInstance());
      result.put("sharesSeen", Integer.toString(own.getSharesCount()));
      result.put("ownTenantOnly", Boolean.toString(own.getSharesList().stream()
          .allMatch(s -> s.getTenant().equals("uid:65534"))));
      result.put("revokeVictims", status(() -> admin.removeShare(RemoveShareRequest.newBuilder()
          .setTenant("uid:0").setShareId(victimShareId).build())));
      result.put("revokeVictimsAsOwn", status(() -> admin.removeShare(RemoveShareRequest.newBuilder()
          .setShareId(victimShareId).build())));
      System.out.println("SHARED session=" + producer.sessionId() + " lease=" + leaseId);
      System.out.flush();
      STDIN.readLine();
      result.put("attachAfterRevoke", status(() -> holder.attach(token)));
      hold.close();
      result.put("released", "OK");
    }
  }

  /** {@code OK}, or the status code the call ended with. */
  private static String status(Supplier<?> call) {
    try {
      call.get();
      return "OK";
    } catch (StatusRuntimeException e) {
      return e.getStatus().getCode().name();
    } catch (GpuMemException e) {
      return e.code().name();
    }
  }
}
