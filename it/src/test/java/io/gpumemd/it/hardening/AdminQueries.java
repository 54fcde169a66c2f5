package io.gpumemd.it.hardening;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.ShareInfo;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;

/** What the tests ask the Admin service, over every page. Stateless. */
final class AdminQueries {
  private AdminQueries() {}

  /** Every live session the caller may see (all of them for an admin), page by page. */
  static List<SessionInfo> sessions(AdminGrpc.AdminBlockingStub admin) {
    List<SessionInfo> all = new ArrayList<>();
    String token = "";
    do {
      ListSessionsResponse page = admin.withDeadlineAfter(10, TimeUnit.SECONDS)
          .listSessions(ListSessionsRequest.newBuilder().setPageSize(5000).setPageToken(token).build());
      all.addAll(page.getSessionsList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return all;
  }

  /** Every live share token the caller may see (all tenants' for an admin), page by page. */
  static List<ShareInfo> shares(AdminGrpc.AdminBlockingStub admin) {
    List<ShareInfo> all = new ArrayList<>();
    String token = "";
    do {
      ListSharesResponse page = admin.withDeadlineAfter(10, TimeUnit.SECONDS)
          .listShares(ListSharesRequest.newBuilder().setPageSize(5000).setPageToken(token).build());
      all.addAll(page.getSharesList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return all;
  }

  /** Of {@code ids}, those still live. */
  static Set<String> stillLive(AdminGrpc.AdminBlockingStub admin, Collection<String> ids) {
    Set<String> live = new HashSet<>();
    for (SessionInfo s : sessions(admin)) {
      if (ids.contains(s.getSessionId())) {
        live.add(s.getSessionId());
      }
    }
    return live;
  }

  /** Waits up to {@code millis} for every session of {@code ids} to end; returns those still live. */
  static Set<String> awaitEnded(AdminGrpc.AdminBlockingStub admin, Collection<String> ids, long millis)
      throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    Set<String> live = stillLive(admin, ids);
    while (!live.isEmpty() && System.nanoTime() < deadline) {
      Thread.sleep(100);
      live = stillLive(admin, ids);
    }
    return live;
  }
}
