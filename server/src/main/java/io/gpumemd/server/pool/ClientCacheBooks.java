package io.gpumemd.server.pool;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The pool's books of the blocks clients keep closed in their own cache tier
 * (<i>client-cached</i>): still leased to them, counted against their quota, but not in use.
 * They count against the pool's retention cap like its own cache, and when the pool needs
 * their memory (a miss, the cap, a trim) it asks their holders to give them back ({@link
 * HolderRequests#requestCacheReturn}), the largest first, each holder once until it has given
 * back all it held; a holder that does not within the unmap wait is reported overdue ({@link
 * HolderRequests#cacheReturnOverdue}).
 *
 * <p>It also sums what clients report of their own cache (hits, returns): those two counters
 * saturate at {@link Long#MAX_VALUE}, since every tenant reads the sum of every client's
 * reports, and a client may report as much as a long holds.
 *
 * <p>The books are not thread-safe: those methods are called with the owning pool's lock ({@link
 * PoolCore#lock}) held. The reported counters need no lock ({@link #reported}).
 */
final class ClientCacheBooks {
  private final ReentrantLock lock;
  /** Keeps the lease figures, which a client-cached block leaves and rejoins. */
  private final BlockCarver carver;
  /** Client-cached bytes by holder. */
  private final Map<String, Long> byHolder = new HashMap<>();
  /** Holders asked to give theirs back that have not done so yet. */
  private final Set<String> returnAsked = new HashSet<>();
  private long bytes;
  private final AtomicLong reportedHits = new AtomicLong();
  private final AtomicLong reportedReturns = new AtomicLong();

  ClientCacheBooks(ReentrantLock lock, BlockCarver carver) {
    this.lock = lock;
    this.carver = carver;
  }

  /**
   * A holder keeps a leased block in its cache: it no longer counts as leased.
   *
   * @throws IllegalStateException when the block is not leased
   */
  void cached(Block block, String holder) {
    assert lock.isHeldByCurrentThread();
    if (block.state != Block.State.LEASED) {
      throw new IllegalStateException("client-caching a block that is not leased: " + block);
    }
    carver.unleased(block);
    block.state = Block.State.CLIENT_CACHED;
    block.cachedBy = holder;
    bytes += block.size;
    byHolder.merge(holder, block.size, Long::sum);
  }

  /**
   * A holder hands a block from its cache out again: it counts as leased again.
   *
   * @throws IllegalStateException when the block is not client-cached
   */
  void reused(Block block) {
    assert lock.isHeldByCurrentThread();
    if (block.state != Block.State.CLIENT_CACHED) {
      throw new IllegalStateException("reusing a block that is not client-cached: " + block);
    }
    uncached(block);
    carver.leasedAgain(block);
  }

  /**
   * A client-cached block leaves the client's cache: reused, or released. A holder that has
   * given back all it held may be asked again.
   */
  void uncached(Block block) {
    assert lock.isHeldByCurrentThread() && block.state == Block.State.CLIENT_CACHED;
    bytes -= block.size;
    String holder = block.cachedBy;
    block.cachedBy = null;
    if (byHolder.merge(holder, -block.size, Long::sum) == 0) {
      byHolder.remove(holder);
      returnAsked.remove(holder);
    }
  }

  /**
   * Asks holders to give back client-cached blocks: the largest holders first until {@code
   * bytes} are asked for, or every holder for all of theirs when {@code bytes} is 0. A holder
   * already asked is not asked again until it has given everything back.
   */
  void askReturns(long bytes, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    if (this.bytes == 0) {
      return;
    }
    List<Map.Entry<String, Long>> byBytes = new ArrayList<>(byHolder.entrySet());
    byBytes.sort(Map.Entry.<String, Long>comparingByValue().reversed());
    long asked = 0;
    for (Map.Entry<String, Long> e : byBytes) {
      if (bytes > 0 && asked >= bytes) {
        break;
      }
      asked += e.getValue();
      if (returnAsked.add(e.getKey())) {
        after.askCacheReturn(e.getKey(), bytes == 0 ? 0 : Math.min(e.getValue(), bytes - asked + e.getValue()));
      }
    }
  }

  /** Reports holders asked to give back cached blocks that still hold some; true if any. */
  boolean overdueReturns(AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    boolean any = false;
    for (String holder : returnAsked) {
      if (byHolder.containsKey(holder)) {
        after.cacheReturnOverdue(holder);
        any = true;
      }
    }
    return any;
  }

  /** Holders asked to give theirs back that have not yet; a copy (snapshot). */
  List<String> returnAsked() {
    return List.copyOf(returnAsked);
  }

  /** The pool restored from had asked this holder already: it is not asked again until it gave all back. */
  void restoreReturnAsked(String holder) {
    assert lock.isHeldByCurrentThread();
    if (byHolder.containsKey(holder)) {
      returnAsked.add(holder);
    }
  }

  long reportedHits() {
    return reportedHits.get();
  }

  long reportedReturns() {
    return reportedReturns.get();
  }

  /** Client-cached bytes of every holder. */
  long bytes() {
    return bytes;
  }

  /** Client-cached bytes by holder, read-only; for {@link PoolInvariants}. */
  Map<String, Long> byHolder() {
    return Collections.unmodifiableMap(byHolder);
  }

  /**
   * Adds what a client reports its own cache did (validated deltas, never negative); without
   * the lock.
   */
  void reported(long hits, long returns) {
    assert hits >= 0 && returns >= 0 : hits + ", " + returns;
    reportedHits.accumulateAndGet(hits, ClientCacheBooks::saturatedSum);
    reportedReturns.accumulateAndGet(returns, ClientCacheBooks::saturatedSum);
  }

  private static long saturatedSum(long a, long b) {
    long sum = a + b;
    // Both operands are non-negative, so a wrapped sum is exactly a negative one.
    return sum < 0 ? Long.MAX_VALUE : sum;
  }

  /** Fills in the figures this class keeps. */
  void report(long[] v) {
    v[PoolMetric.CLIENT_CACHED_BYTES.ordinal()] = bytes;
    v[PoolMetric.CLIENT_CACHE_HITS.ordinal()] = reportedHits.get();
    v[PoolMetric.CLIENT_CACHE_RETURNS.ordinal()] = reportedReturns.get();
  }

  /** Forgets every client-cached block: the pool is closing. The reported counters stay. */
  void clear() {
    assert lock.isHeldByCurrentThread();
    byHolder.clear();
    returnAsked.clear();
    bytes = 0;
  }
}
