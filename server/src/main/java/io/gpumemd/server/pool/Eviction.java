package io.gpumemd.server.pool;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.locks.ReentrantLock;

/**
 * How one pool gives memory back to its backend: the retention cap, eviction, trimming, and
 * the last step of the unmap handshake.
 *
 * <ul>
 *   <li>The retention cap bounds the pool's cached bytes (its idle segments, {@link
 *       BlockCarver}) and its clients' cached bytes ({@link ClientCacheBooks}) together. While
 *       they exceed it, the least recently used idle segment is evicted; when the clients'
 *       caches alone exceed it, their holders are asked for the excess.
 *   <li>A miss over budget evicts idle segments of any owner, least recently used first, until
 *       its segment fits ({@link #evictUntilFits}).
 *   <li>Eviction frees a whole idle segment. A segment that a holder may have mapped is not
 *       freed at once: the holder is asked to unmap it ({@link HolderMappings}, {@link
 *       HolderRequests}) and it is freed ({@link #free}) when every such holder has confirmed
 *       or ended. The backend free itself runs once the lock is released ({@link AfterUnlock}).
 *   <li>A trim evicts down to what it keeps, asks clients for their cached blocks and waits
 *       (up to the unmap wait) to evict what comes back.
 *   <li>Closing gives up every segment at once, mapped or not ({@link #giveUpAll}).
 * </ul>
 *
 * <p>It works on the books of one {@link PoolCore} and owns only the retention cap.
 *
 * <p>Thread-safety: the methods that the pool's public calls delegate to ({@link
 * #setRetentionCap}, {@link #trim}, {@link #unmapped}, {@link #dropped}, {@link #holderEnded})
 * take the core's lock; the others are called with it held. The backend's frees end in {@link
 * PoolCore#segmentFreed}.
 */
final class Eviction {
  private final PoolCore core;
  private final ReentrantLock lock;
  private final BlockCarver carver;
  private final ClientCacheBooks clientCache;
  private final HolderMappings holders;
  private final Budget budget;
  private final PoolCounters counters;
  private long retentionCapBytes;
  /** True once SetRetentionCap set the cap (it then outranks the flag of a daemon that restores the pool). */
  private boolean capSetAtRuntime;

  Eviction(PoolCore core, long retentionCapBytes) {
    this.core = core;
    this.lock = core.lock;
    this.carver = core.carver;
    this.clientCache = core.clientCache;
    this.holders = core.holders;
    this.budget = core.budget;
    this.counters = core.counters;
    this.retentionCapBytes = retentionCapBytes;
  }

  long retentionCapBytes() {
    return retentionCapBytes;
  }

  boolean capSetAtRuntime() {
    return capSetAtRuntime;
  }

  /** The runtime cap of the pool restored from (restore); with the lock held, before the pool is used. */
  void restoreRuntimeCap(long capBytes) {
    assert lock.isHeldByCurrentThread();
    retentionCapBytes = capBytes;
    capSetAtRuntime = true;
  }

  // ----------------------------------------------------------------------- taking the lock

  /** Sets the retention cap and evicts at once down to it; returns the bytes evicted. */
  long setRetentionCap(long capBytes) {
    return AfterUnlock.locked(core, after -> {
      retentionCapBytes = capBytes;
      capSetAtRuntime = true;
      return enforceCap(capBytes, after);
    });
  }

  /** See {@link DevicePool#trim}. */
  long trim(long keepBytes) {
    long evicted = 0;
    long deadline = core.ticker.nanos() + core.unmapWaitNanos;
    while (true) {
      AfterUnlock after = new AfterUnlock(core);
      boolean waitForClients;
      long epoch;
      lock.lock();
      try {
        epoch = core.waiters.epoch();
        evicted += enforceCap(keepBytes, after);
        waitForClients = carver.cachedBytes() + clientCache.bytes() > keepBytes && clientCache.bytes() > 0;
        if (waitForClients && core.ticker.nanos() >= deadline) {
          clientCache.overdueReturns(after);
          waitForClients = false;
        }
      } finally {
        lock.unlock();
        after.run();
      }
      if (!waitForClients) {
        return evicted;
      }
      core.waiters.await(deadline, epoch);
    }
  }

  /** A holder confirmed an unmap: the segment is freed when that was its last mapper. */
  void unmapped(String holder, long segmentId) {
    AfterUnlock.locked(core, after -> freeIfLast(holders.unmapped(holder, segmentId), after));
  }

  /** A holder no longer maps one segment: freed when it was evicted and this was its last mapper. */
  void dropped(String holder, long segmentId) {
    AfterUnlock.locked(core, after -> freeIfLast(holders.dropped(holder, segmentId), after));
  }

  /** Frees an evicted segment whose last mapper just went (null: none did). */
  private Void freeIfLast(Segment segment, AfterUnlock after) {
    if (segment != null) {
      free(segment, after);
      core.waiters.memoryCameBack();
    }
    return null;
  }

  /** A holder ended: the segments it was the last mapper of are freed. */
  void holderEnded(String holder) {
    AfterUnlock.locked(core, after -> {
      List<Segment> freed = holders.holderEnded(holder);
      for (Segment segment : freed) {
        free(segment, after);
      }
      if (!freed.isEmpty()) {
        core.waiters.memoryCameBack();
      }
      return null;
    });
  }

  /**
   * See {@link DevicePool#sleep}: checks every block first, so that a refusal changes nothing.
   */
  List<Block> sleep(List<Block> blocks, String holder, Collection<Long> vacatedSegmentIds) {
    return AfterUnlock.locked(core, after -> {
      for (Block block : blocks) {
        if (block.state != Block.State.LEASED || block.segment.state != Segment.State.LIVE) {
          throw new IllegalStateException("sleep of a block that is not leased: " + block);
        }
      }
      List<Block> places = new ArrayList<>(blocks.size());
      for (Block block : blocks) {
        places.add(block.detached());
        carver.unleased(block);
        carver.giveBack(block);
      }
      for (long segmentId : vacatedSegmentIds) {
        Segment segment = core.segment(segmentId);
        if (segment == null) {
          continue;
        }
        boolean last = holders.vacated(holder, segment);
        if (segment.state == Segment.State.AWAITING_UNMAP) {
          freeIfLast(last ? segment : null, after);
        } else if (segment.idle() && carver.idle.remove(segment)) {
          // Not kept in the cache: the sleep is there to give the memory to others now.
          evict(segment, after);
        }
      }
      core.waiters.memoryCameBack();
      return places;
    });
  }

  /**
   * See {@link PoolSleep#park}: the block is freed, and its segment, when that left it unused
   * and nobody maps it, is given back to the backend at once rather than cached.
   */
  Block park(Block block) {
    return AfterUnlock.locked(core, after -> {
      if (block.state != Block.State.LEASED || block.segment.state != Segment.State.LIVE) {
        throw new IllegalStateException("parking a block that is not leased: " + block);
      }
      Block place = block.detached();
      Segment segment = block.segment;
      carver.unleased(block);
      carver.giveBack(block);
      if (segment.idle() && segment.mappers.isEmpty() && carver.idle.remove(segment)) {
        evict(segment, after);
      }
      core.waiters.memoryCameBack();
      return place;
    });
  }

  // ---------------------------------------------------------------------- with the lock held

  /** Applies the retention cap; returns the bytes of segments evicted. */
  long enforceCap(AfterUnlock after) {
    return enforceCap(retentionCapBytes, after);
  }

  /**
   * Evicts idle segments, least recently used first, until the pool's cache and the clients'
   * caches together hold at most {@code cap}; if the clients' caches alone exceed it, asks
   * their holders for the excess.
   *
   * @return bytes of segments evicted
   */
  long enforceCap(long cap, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    long evicted = 0;
    Segment segment;
    while (carver.cachedBytes() + clientCache.bytes() > cap && (segment = carver.pollIdle()) != null) {
      evicted += evict(segment, after);
    }
    if (clientCache.bytes() > cap) {
      clientCache.askReturns(clientCache.bytes() - cap, after);
    }
    return evicted;
  }

  /** Evicts idle segments until a segment of {@code segmentBytes} fits; true if any was evicted. */
  boolean evictUntilFits(long segmentBytes, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    // Evicting only helps if what can be freed at once would make room.
    if (!budget.fitsWithout(carver.cachedBytes(), segmentBytes)) {
      return false;
    }
    boolean any = false;
    Segment segment;
    while (!budget.fits(segmentBytes) && (segment = carver.pollIdle()) != null) {
      evict(segment, after);
      any = true;
    }
    return any;
  }

  /** Evicts one idle segment (already out of the idle list); returns its bytes. */
  private long evict(Segment segment, AfterUnlock after) {
    carver.retire(segment);
    counters.increment(PoolMetric.EVICTIONS);
    var mappers = holders.awaitUnmaps(segment);
    if (mappers == null) {
      free(segment, after);
    } else {
      for (String holder : mappers) {
        after.askUnmap(holder, segment.id);
      }
    }
    return segment.bytes;
  }

  /**
   * Gives up every segment, leased or not, mapped or not, and forgets the blocks: the pool is
   * closing and frees them itself, once unlocked ({@code freeing}, counted as backend frees), or
   * hands them to another process (not counted: the memory lives on).
   *
   * @return the segments to free
   */
  List<Segment> giveUpAll(boolean freeing) {
    assert lock.isHeldByCurrentThread();
    List<Segment> all = new ArrayList<>(carver.clear());
    all.addAll(holders.awaitingUnmap());
    holders.clear();
    clientCache.clear();
    for (Segment s : all) {
      s.state = Segment.State.FREED;
    }
    if (freeing) {
      counters.add(PoolMetric.BACKEND_FREES, all.size());
    }
    budget.closed();
    return all;
  }

  /** Gives up a segment nobody maps any more: the backend frees it once the lock is released. */
  private void free(Segment segment, AfterUnlock after) {
    assert lock.isHeldByCurrentThread();
    segment.state = Segment.State.FREED;
    budget.freeing(segment.bytes); // until the backend has freed it (AfterUnlock, then PoolCore.segmentFreed)
    counters.increment(PoolMetric.BACKEND_FREES);
    after.free(segment);
  }
}
