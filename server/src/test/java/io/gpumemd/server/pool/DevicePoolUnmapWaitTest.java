package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.testing.FakeTicker;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A miss that fits once an evicted segment is unmapped waits for the unmap, and its deadline
 * is kept on the pool's ticker: with a fake clock the test decides when it has passed, so a
 * one-minute wait ends the moment the clock says so, and not a moment before.
 */
class DevicePoolUnmapWaitTest {
  private static final long MiB = 1 << 20;

  private final FakeTicker ticker = new FakeTicker();
  private final InMemoryBackend backend = new InMemoryBackend(8 * MiB);
  private final DevicePool pool = new DevicePool(backend.devices().get(0), backend,
      new PoolSettings(4 * MiB, 4 * MiB, 20 * MiB, TimeUnit.MINUTES.toMillis(1)),
      new RecordingHolders(), DevicePools.segmentIdBase(0), ticker);

  @AfterEach
  void close() {
    pool.verifyInvariants();
    pool.close();
  }

  /** Holder "mapper" maps a 4 MiB segment that is then evicted: it waits for mapper's unmap. */
  private long evictedButMapped() {
    LeasedBlock first = pool.lease(4 * MiB, false, "mapper", SegmentOwner.DAEMON);
    pool.release(first.block(), null);
    pool.setRetentionCap(0);
    assertEquals(4 * MiB, pool.stats().get(PoolMetric.AWAITING_UNMAP_BYTES));
    return first.block().segmentId();
  }

  @Test
  void waitingMiss_givesUpWhenTheTickerPassesTheDeadline() throws Exception {
    evictedButMapped();
    CompletableFuture<LeasedBlock> waiting = CompletableFuture.supplyAsync(() -> pool.lease(4 * MiB, false, "other", SegmentOwner.DAEMON));
    Thread.sleep(100);
    assertFalse(waiting.isDone(), "the miss waits for the unmap");

    ticker.advance(61, TimeUnit.SECONDS);
    ExecutionException e = org.junit.jupiter.api.Assertions.assertThrows(ExecutionException.class,
        () -> waiting.get(5, TimeUnit.SECONDS));
    assertInstanceOf(ExhaustedException.class, e.getCause());
    assertTrue(e.getCause().getMessage().contains("awaiting_unmap=4194304"), e.getCause().getMessage());
    assertEquals(1, pool.stats().get(PoolMetric.OOMS));
  }

  @Test
  void waitingMiss_proceedsWhenTheHolderUnmaps() throws Exception {
    long segment = evictedButMapped();
    CompletableFuture<LeasedBlock> waiting = CompletableFuture.supplyAsync(() -> pool.lease(4 * MiB, false, "other", SegmentOwner.DAEMON));
    Thread.sleep(50);
    assertFalse(waiting.isDone());

    pool.unmapped("mapper", segment);
    LeasedBlock leased = waiting.get(5, TimeUnit.SECONDS);
    assertFalse(leased.poolHit());
    assertEquals(0, pool.stats().get(PoolMetric.AWAITING_UNMAP_BYTES));
    pool.release(leased.block(), null);
  }
}
