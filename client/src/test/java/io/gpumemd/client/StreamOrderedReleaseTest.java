package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.Await;
import io.gpumemd.server.testing.TestDaemon;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Stream-ordered release ({@link CudaLeases#closeAfter}) without a GPU: the real {@link
 * PendingReleases} queue and its thread, against a real daemon on the host backend, with a
 * {@link Gate} standing in for the CUDA event (no event exists without a device): the test
 * decides when it completes, and counts its queries and destroys. What the CUDA event adds
 * ({@code cuEventQuery}, {@code cuEventDestroy} in the pushed context) is covered by the GPU
 * test {@code CudaVmmTest}.
 */
class StreamOrderedReleaseTest {
  private static final long KiB = 1 << 10;
  private TestDaemon daemon;
  private final List<GpuMemClient> clients = new ArrayList<>();

  /** A completion the test opens; it counts queries and destroys. */
  static final class Gate implements PendingReleases.Completion {
    final AtomicBoolean open = new AtomicBoolean();
    final AtomicInteger queries = new AtomicInteger();
    final AtomicInteger destroyed = new AtomicInteger();
    /** Completes by itself at this query (0: only when opened). */
    final int completesAt;
    final RuntimeException failure;

    Gate() {
      this(0, null);
    }

    Gate(int completesAt, RuntimeException failure) {
      this.completesAt = completesAt;
      this.failure = failure;
    }

    @Override
    public boolean isComplete() {
      int n = queries.incrementAndGet();
      if (failure != null) {
        throw failure;
      }
      return open.get() || (completesAt > 0 && n >= completesAt);
    }

    @Override
    public void destroy() {
      destroyed.incrementAndGet();
    }
  }

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    try {
      clients.forEach(GpuMemClient::close);
      Await.until(() -> daemon.server().registry().sessionCount() == 0, "every session ended");
      assertEquals(0, pool(PoolMetric.LEASED_BYTES), "leased bytes after the clients closed");
      daemon.verifyInvariants();
    } finally {
      daemon.close();
    }
  }

  private GpuMemClient client(long cacheBytes) {
    GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(cacheBytes).connect();
    clients.add(client);
    return client;
  }

  @Test
  void closeWhen_closesAtOnce_andReleasesOnlyOnceTheCompletionCompletes() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 64 * KiB);
    Gate gate = new Gate();
    assertTrue(lease.closeWhen(gate));
    assertTrue(lease.isClosed(), "closed for the caller at once");
    assertEquals(1, client.pendingReleases());
    Await.until(() -> gate.queries.get() >= 3, "the releases thread polls the completion");
    assertEquals(64 * KiB, pool(PoolMetric.LEASED_BYTES), "not released while its work is pending");
    assertEquals(0, gate.destroyed.get());

    gate.open.set(true);
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "released once complete");
    assertEquals(1, gate.destroyed.get(), "the event is destroyed once");
    assertEquals(0, client.pendingReleases());
    assertEquals(1, client.stats().releases());
  }

  @Test
  void completedRelease_isGivenBackAsAnyClose_intoTheClientCache() {
    GpuMemClient client = client(1 << 20);
    Lease lease = client.lease(0, 64 * KiB);
    Gate gate = new Gate(1, null);
    lease.closeWhen(gate);
    Await.until(() -> client.pendingReleases() == 0, "the release went through");
    try (Lease next = client.lease(0, 64 * KiB)) {
      assertTrue(next.localHit(), "after its event, the block is as reusable as any closed lease");
    }
    assertEquals(1, gate.destroyed.get());
  }

  /**
   * Issue 33 item 6: a query error other than NOT_READY leaves the work's state unknown, so the
   * lease is kept (as the Python client keeps it): released on such an error, the block could go
   * to another process while a kernel still writes it. The session's end returns it.
   */
  @Test
  void completionThatCannotBeQueried_keepsTheLease_loggedOnce_andTheSessionEndReturnsIt() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 64 * KiB);
    Gate gate = new Gate(0, new IllegalStateException("cuEventQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS"));
    try (LogCapture log = new LogCapture(GpuMemClient.class)) {
      lease.closeWhen(gate);
      Await.until(() -> client.pendingReleases() == 0, "settled");
      List<String> warnings = log.messages("WARN").stream()
          .filter(m -> m.contains(lease.id()) && m.contains("CUDA_ERROR_ILLEGAL_ADDRESS")).toList();
      assertEquals(1, warnings.size(), "one WARN naming the lease and the error: " + log.messages("WARN"));
      assertTrue(warnings.get(0).contains("not released"), warnings.get(0));
    }
    assertEquals(1, gate.queries.get(), "queried once, never again");
    assertEquals(1, gate.destroyed.get());
    assertEquals(0, client.stats().releases(), "not released");
    assertTrue(pool(PoolMetric.LEASED_BYTES) >= 64 * KiB, "still leased by the session");
    client.close();
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the session's end returned it");
  }

  @Test
  void secondClose_isRefused_andLeavesTheCompletionToTheCaller() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 64 * KiB);
    lease.close();
    Gate gate = new Gate();
    assertFalse(lease.closeWhen(gate));
    assertEquals(0, client.pendingReleases());
    assertEquals(0, gate.queries.get());
  }

  @Test
  void clientClose_waitsForAReleaseThatCompletesMeanwhile_andSendsIt() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 64 * KiB);
    Gate gate = new Gate(50, null); // completes at its 50th query, while close waits
    lease.closeWhen(gate);
    client.close();
    assertEquals(50, gate.queries.get());
    assertEquals(1, gate.destroyed.get());
    assertEquals(1, client.stats().releases(), "sent as a release, before CloseSession");
  }

  @Test
  void clientClose_withAReleaseThatNeverCompletes_destroysTheEvent_andTheSessionEndReturnsTheBlock() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 64 * KiB);
    Gate gate = new Gate();
    lease.closeWhen(gate);
    try (LogCapture log = new LogCapture(GpuMemClient.class)) {
      client.close(); // waits its bound (PENDING_RELEASES_CLOSE_MS), then gives up on the event
      assertTrue(log.messages("WARN").stream().anyMatch(m -> m.contains("1 stream-ordered release(s) still waiting")),
          String.valueOf(log.messages("WARN")));
    }
    assertEquals(1, gate.destroyed.get(), "no event outlives the client");
    assertEquals(0, client.stats().releases(), "never sent: CloseSession returned the block");
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the session's end returned it");
  }

  @Test
  void releaseAfterTheClientClosed_isNotQueued_andItsCompletionIsDestroyed() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 64 * KiB);
    client.close();
    Gate gate = new Gate();
    assertTrue(lease.closeWhen(gate));
    assertEquals(1, gate.destroyed.get());
    assertEquals(0, gate.queries.get());
    assertEquals(0, client.pendingReleases());
  }

  /** The queue alone: a lease whose session is lost is dropped, its completion destroyed. */
  @Test
  void lostSession_dropsThePendingRelease_andDestroysItsCompletion() {
    AtomicBoolean lost = new AtomicBoolean();
    Lease lease = new Lease(new LostOwner(lost), LeaseResponse.newBuilder().setLeaseId("l1").build(), null, "",
        false, false);
    PendingReleases pending = new PendingReleases();
    AtomicInteger released = new AtomicInteger();
    Gate gate = new Gate();
    assertTrue(pending.add(lease, gate, l -> released.incrementAndGet()));
    Await.until(() -> gate.queries.get() >= 2, "polled");
    lost.set(true);
    Await.until(() -> pending.pending() == 0, "dropped with its session");
    assertEquals(1, gate.destroyed.get());
    assertEquals(0, released.get(), "nothing is sent for a lost session");
    assertEquals(0, pending.close(1000));
    Gate late = new Gate();
    assertFalse(pending.add(lease, late, l -> released.incrementAndGet()), "refused once closed");
  }

  @Test
  void pointerOfAClosedLease_isRefused() {
    GpuMemClient client = client(0);
    Lease lease = client.lease(0, 4 * KiB);
    lease.close();
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> CudaLeases.pointer(lease));
    assertEquals("lease " + lease.id() + " is closed", e.getMessage());
  }

  /** A locally served zero lease is zeroed over its whole block, as the daemon zeroes it. */
  @Test
  void localZeroLease_zeroesTheWholeBlock() {
    GpuMemClient client = client(1 << 20);
    Lease first = client.lease(0, 1024);
    ByteBuffer all = first.blockBuffer();
    while (all.hasRemaining()) {
      all.put((byte) 0x5a);
    }
    long block = first.blockBytes();
    first.close();
    try (Lease again = client.lease(0, 600, true, "zeroed")) {
      assertTrue(again.localHit());
      assertEquals(block, again.blockBytes());
      ByteBuffer whole = again.blockBuffer();
      for (int i = 0; i < block; i++) {
        assertEquals(0, whole.get(i), "byte " + i + " of the " + block + "-byte block");
      }
    }
  }

  private long pool(PoolMetric metric) {
    return daemon.server().pools().get(0).stats().get(metric);
  }

  /** An owner whose session the test loses; nothing else of it is used. */
  private record LostOwner(AtomicBoolean lost) implements Lease.Owner {
    @Override
    public boolean isLost() {
      return lost.get();
    }

    @Override
    public void giveBack(Lease lease) {
      throw new AssertionError("not given back");
    }

    @Override
    public void giveBackWhen(Lease lease, PendingReleases.Completion done) {
      throw new AssertionError("not given back");
    }

    @Override
    public CompletableFuture<Void> giveBackAsync(Lease lease) {
      throw new AssertionError("not given back");
    }

    @Override
    public Share share(Lease lease, ShareOptions options) {
      throw new AssertionError();
    }

    @Override
    public Published publish(Lease lease, String name, boolean readOnly) {
      throw new AssertionError();
    }
  }
}
