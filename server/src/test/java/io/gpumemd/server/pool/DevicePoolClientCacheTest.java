package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.error.ExhaustedException;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Blocks clients keep closed in their own cache tier: how the pool counts them, and how it
 * gets them back when it needs the memory (a miss, the retention cap, a trim), also from a
 * client that does not answer.
 */
class DevicePoolClientCacheTest extends PoolTestBase {
  private static final String CLIENT = "client-a";

  /** A pool with its own budget and cap, and the unmap wait that bounds waits for clients. */
  private CheckedPool usePool(long limit, long cap, long waitMillis) {
    return use(new CheckedPool(new InMemoryBackend(1, 64 * MiB, true), new PoolSettings(limit, cap, 20 * MiB, waitMillis)));
  }

  /**
   * The same, for tests whose client releases on another thread while the test thread leases
   * or trims: the per-release exactness checks assume one thread, the rest still hold.
   */
  private CheckedPool useConcurrentPool(long limit, long cap, long waitMillis) {
    return use(new CheckedPool(new InMemoryBackend(1, 64 * MiB, true), new PoolSettings(limit, cap, 20 * MiB, waitMillis),
        false));
  }

  @Test
  void clientCached_movesBytesFromLeasedToClientCached_andBackOnReuse() {
    Block block = lease(4 * MiB, false, CLIENT);
    pool.clientCached(block, CLIENT);
    assertEquals(0, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(4 * MiB, stats().get(PoolMetric.CLIENT_CACHED_BYTES));
    assertEquals(4 * MiB, stats().get(PoolMetric.RESERVED_BYTES), "still the backend's memory");
    assertEquals(0, stats().get(PoolMetric.ACTIVE_LEASES));
    pool.verifyInvariants();

    pool.clientReused(block);
    assertEquals(4 * MiB, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(0, stats().get(PoolMetric.CLIENT_CACHED_BYTES));

    pool.clientCached(block, CLIENT);
    release(block); // a client-cached block is released as it is
    assertEquals(0, stats().get(PoolMetric.CLIENT_CACHED_BYTES));
    assertEquals(4 * MiB, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(1, stats().get(PoolMetric.RETURNS));
  }

  @Test
  void wrongTransitions_areRefused_andChangeNothing() {
    Block block = lease(4096, false, CLIENT);
    assertThrows(IllegalStateException.class, () -> pool.clientReused(block), "not cached");
    pool.clientCached(block, CLIENT);
    assertThrows(IllegalStateException.class, () -> pool.clientCached(block, CLIENT), "cached twice");
    assertEquals(4096, stats().get(PoolMetric.CLIENT_CACHED_BYTES));
    release(block);
  }

  @Test
  void clientCounters_addToThePoolsOwn() {
    pool.addClientCounters(5, 3);
    pool.addClientCounters(2, 0);
    assertEquals(7, stats().get(PoolMetric.CLIENT_CACHE_HITS));
    assertEquals(3, stats().get(PoolMetric.CLIENT_CACHE_RETURNS));
  }

  @Test
  void clientCounters_saturateAtLongMax_insteadOfWrappingNegative() {
    pool.addClientCounters(Long.MAX_VALUE, Long.MAX_VALUE - 1);
    pool.addClientCounters(Long.MAX_VALUE, 1);
    pool.addClientCounters(1, 1);
    assertEquals(Long.MAX_VALUE, stats().get(PoolMetric.CLIENT_CACHE_HITS));
    assertEquals(Long.MAX_VALUE, stats().get(PoolMetric.CLIENT_CACHE_RETURNS));
  }

  @Test
  void retentionCap_countsClientCachedBytes_evictingThePoolsOwnFirst_thenAskingTheClient() {
    usePool(64 * MiB, 8 * MiB, 0);
    Block idle = lease(4 * MiB, false, "other");
    release(idle);
    assertEquals(4 * MiB, stats().get(PoolMetric.CACHED_BYTES));
    Block a = lease(6 * MiB, false, CLIENT);
    pool.clientCached(a, CLIENT); // 4 cached + 6 client-cached > 8: the pool's own idle segment goes
    assertEquals(0, stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(1, stats().get(PoolMetric.EVICTIONS));
    assertTrue(checked.holders.requests("return").isEmpty(), "the client's 6 MiB fit the cap: not asked");

    Block b = lease(4 * MiB, false, CLIENT);
    pool.clientCached(b, CLIENT); // the client's cache alone, 10 MiB, exceeds the cap
    List<RecordingHolders.Request> asked = checked.holders.requests("return");
    assertEquals(1, asked.size(), asked.toString());
    assertEquals(CLIENT, asked.get(0).holder());
    assertEquals(2 * MiB, asked.get(0).value(), "asked for the excess");
    release(a);
    release(b);
  }

  @Test
  void missThatNeedsClientCachedMemory_asksForIt_andProceedsWhenItComesBack() throws Exception {
    useConcurrentPool(8 * MiB, 8 * MiB, 5_000);
    Block held = lease(8 * MiB, false, CLIENT);
    pool.clientCached(held, CLIENT);
    // The client answers as a real one does: it releases its cached blocks on that device.
    checked.holders.onCacheReturn((holder, device, bytes) -> CompletableFuture.runAsync(() -> release(held)));

    Block other = lease(8 * MiB, false, "other");
    assertEquals(8 * MiB, stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(0, stats().get(PoolMetric.CLIENT_CACHED_BYTES));
    assertEquals(List.of(new RecordingHolders.Request("return", CLIENT, 0, 0)), checked.holders.requests("return"));
    assertEquals(0, stats().get(PoolMetric.OOMS));
    release(other);
  }

  @Test
  void clientThatDoesNotGiveBack_isReportedOverdue_andTheMissIsRefusedSayingWhy() {
    usePool(8 * MiB, 8 * MiB, 100);
    Block held = lease(8 * MiB, false, CLIENT);
    pool.clientCached(held, CLIENT);

    long start = System.nanoTime();
    ExhaustedException e = assertThrows(ExhaustedException.class, () -> lease(8 * MiB, false, "other"));
    assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(100), "waited the unmap wait");
    assertTrue(e.getMessage().contains("clients did not give back their cached blocks within the unmap wait"), e.getMessage());
    assertTrue(e.getMessage().contains("client_cached=8388608"), e.getMessage());
    assertEquals(List.of(new RecordingHolders.Request("overdue", CLIENT, -1, 0)), checked.holders.requests("overdue"));
    assertEquals(1, stats().get(PoolMetric.OOMS));
    release(held);
  }

  @Test
  void trim_asksClientsForTheirCachedBlocks_andEvictsWhatComesBack() {
    useConcurrentPool(64 * MiB, 64 * MiB, 5_000);
    Block held = lease(4 * MiB, false, CLIENT);
    pool.clientCached(held, CLIENT);
    checked.holders.onCacheReturn((holder, device, bytes) -> CompletableFuture.runAsync(() -> release(held)));

    assertEquals(4 * MiB, pool.trim(0), "the returned block's segment is evicted by the trim");
    assertFalse(checked.holders.requests("return").isEmpty());
    // The client still maps the segment: it is freed once the client confirms the unmap.
    assertEquals(4 * MiB, stats().get(PoolMetric.AWAITING_UNMAP_BYTES));
    pool.unmapped(CLIENT, held.segmentId());
    assertEquals(0, stats().get(PoolMetric.RESERVED_BYTES));
  }
}
