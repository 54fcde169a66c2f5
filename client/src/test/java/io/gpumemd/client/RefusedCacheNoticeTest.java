package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestDaemon;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A cache notice the daemon refuses (RESOURCE_EXHAUSTED: past the allowance it holds the
 * session to) takes the lease out of the tier and releases it, so that the daemon's books
 * (Admin ListSessions, ListLeases, the pool's figures) and the tier's agree.
 */
class RefusedCacheNoticeTest {
  private static final long MIB = 1 << 20;
  private TestDaemon daemon;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--client-cache-bytes", "4MiB");
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  @Test
  void refusedCacheNotice_releasesTheLease_andTheBooksAgree() throws Exception {
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      assertEquals(4 * MIB, client.stats().allowanceBytes());
      // The tier believes in more than the daemon holds it to, as after a lowered allowance
      // that has not arrived yet: the third notice is past the daemon's 4 MiB.
      client.cache().setAllowance(64 * MIB);
      List<Lease> leases = new ArrayList<>();
      for (int i = 0; i < 3; i++) {
        leases.add(client.lease(0, 2 * MIB));
      }
      leases.forEach(Lease::close); // the notices go in order
      await(() -> client.stats().cachedBytes() == 4 * MIB && client.stats().releases() == 1,
          "the refusal applied by the tier: " + client.stats());
      assertEquals(2, client.stats().cachedBlocks());
      await(() -> session(client).getLeases() == 2, "the refused lease released at the daemon");
      assertEquals(4 * MIB, session(client).getClientCachedBytes());
      Set<String> live = leaseIds(client);
      assertFalse(live.contains(leases.get(2).id()), live.toString());
      assertTrue(live.containsAll(Set.of(leases.get(0).id(), leases.get(1).id())), live.toString());
      assertEquals(4 * MIB, daemon.server().pools().get(0).stats().get(PoolMetric.CLIENT_CACHED_BYTES));
      assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES), "nothing left in use");

      // The tier serves only what the daemon counts as cached.
      List<Lease> again = new ArrayList<>();
      for (int i = 0; i < 3; i++) {
        again.add(client.lease(0, 2 * MIB));
      }
      assertEquals(List.of(true, true, false), again.stream().map(Lease::localHit).toList());
      assertEquals(Set.of(leases.get(0).id(), leases.get(1).id()),
          Set.of(again.get(0).id(), again.get(1).id()));
      again.forEach(Lease::close);
      await(() -> client.stats().cachedBytes() == 4 * MIB && client.stats().releases() == 2,
          "the second refusal applied: " + client.stats());
      await(() -> session(client).getLeases() == 2 && session(client).getClientCachedBytes() == 4 * MIB,
          "the daemon's books match the tier's");
      assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES));
    }
    assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.CLIENT_CACHED_BYTES));
  }

  private static SessionInfo session(GpuMemClient client) {
    String id = client.sessionId();
    SessionInfo found = AdminGrpc.newBlockingStub(client.connection().channel())
        .listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsList().stream()
        .filter(s -> s.getSessionId().equals(id)).findFirst().orElse(null);
    assertNotNull(found, "the session at the daemon");
    return found;
  }

  private static Set<String> leaseIds(GpuMemClient client) {
    return AdminGrpc.newBlockingStub(client.connection().channel())
        .listLeases(ListLeasesRequest.newBuilder().setDevice(0).build()).getLeasesList().stream()
        .map(LeaseInfo::getLeaseId).collect(Collectors.toSet());
  }

  /** Waits (bounded, 5 s) for {@code done}; fails with {@code what} if it never holds. */
  private static void await(BooleanSupplier done, String what) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (!done.getAsBoolean() && System.nanoTime() < deadline) {
      Thread.sleep(2);
    }
    assertTrue(done.getAsBoolean(), what);
  }
}
