package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;

/**
 * The structural invariants of a {@link DevicePool}, checked by tests after every operation
 * they care about: blocks tile each segment without gaps or overlaps, free neighbours are
 * coalesced, the free index holds exactly the free blocks, each in the index of its segment's
 * owner (and no owner keeps an empty index), the idle list exactly the wholly
 * free segments, and every byte counter agrees with the blocks:
 * {@code reserved = leased + client_cached + cached + remainder + awaiting_event + awaiting_unmap <= limit}.
 *
 * <p>Called with the pool's lock held.
 */
final class PoolInvariants {
  private PoolInvariants() {}

  /** Throws {@link AssertionError} describing the first violation. */
  static void verify(DevicePool pool) {
    assert pool.lock.isHeldByCurrentThread();
    long segBytes = 0;
    long leased = 0;
    long cached = 0;
    long awaitingEvent = 0;
    long clientCached = 0;
    java.util.Map<String, Long> cachedByHolder = new java.util.HashMap<>();
    long freeBlocks = 0;
    long leasedCount = 0;
    for (Segment s : pool.liveSegments.values()) {
      check(s.state == Segment.State.LIVE, "live segment in state " + s.state);
      segBytes += s.bytes;
      long expectOffset = 0;
      long used = 0;
      Block prev = null;
      for (Block b = s.head; b != null; b = b.next) {
        check(b.prev == prev, "broken prev link at " + b);
        check(b.offset == expectOffset, "gap or overlap at " + b + " (expected offset " + expectOffset + ")");
        check(b.size > 0 && b.size % SizeClasses.ALIGNMENT == 0, "bad size " + b);
        expectOffset += b.size;
        switch (b.state) {
          case FREE -> {
            check(pool.free.contains(b), "free block not indexed: " + b);
            check(prev == null || prev.state != Block.State.FREE, "uncoalesced free neighbours at " + b);
            freeBlocks++;
          }
          case LEASED -> {
            leased += b.size;
            leasedCount++;
            used += b.size;
          }
          case CLIENT_CACHED -> {
            clientCached += b.size;
            used += b.size;
            check(b.cachedBy != null, "client-cached block without its holder: " + b);
            cachedByHolder.merge(b.cachedBy, b.size, Long::sum);
          }
          case AWAITING_EVENT -> {
            awaitingEvent += b.size;
            used += b.size;
          }
        }
        prev = b;
      }
      check(expectOffset == s.bytes, "blocks do not cover " + s);
      check(used == s.usedBytes, "used bytes " + s.usedBytes + " != " + used + " in " + s);
      check(s.idle() == pool.idle.contains(s), "idle list disagrees for " + s);
      if (s.idle()) {
        cached += s.bytes;
      }
    }
    check(pool.idle.size() <= pool.liveSegments.size(), "idle list holds dead segments");
    long awaitingUnmap = 0;
    for (Segment s : pool.holders.awaitingUnmap()) {
      segBytes += s.bytes;
      awaitingUnmap += s.bytes;
      check(s.state == Segment.State.AWAITING_UNMAP, "segment awaiting unmap in state " + s.state);
      check(!s.mappers.isEmpty(), "awaiting-unmap segment without mappers: " + s);
    }
    check(freeBlocks == pool.free.size(), "index holds blocks that are not free");
    int indexed = 0;
    for (var entry : pool.free.byOwner().entrySet()) {
      String owner = entry.getKey();
      BlockIndex index = entry.getValue();
      check(!index.isEmpty(), "empty free index kept for owner '" + owner + "'");
      indexed += index.size();
      index.forEach(b -> {
        // A block in another owner's index could be leased to that owner: the isolation rule.
        check(b.segment.owner.equals(owner), "free " + b + " of " + b.segment + " in the index of owner '" + owner + "'");
        check(b.state == Block.State.FREE, "indexed block is not free: " + b);
        check(b.segment.state == Segment.State.LIVE && pool.liveSegments.get(b.segment.id) == b.segment,
            "indexed block of a segment that is not live: " + b);
      });
    }
    check(indexed == pool.free.size(), "free index count " + pool.free.size() + " != indexed blocks " + indexed);
    check(segBytes == pool.reservedBytes, "reserved " + pool.reservedBytes + " != segments " + segBytes);
    check(leased == pool.leasedBytes, "leased " + pool.leasedBytes + " != blocks " + leased);
    check(leasedCount == pool.activeLeases, "active leases " + pool.activeLeases + " != " + leasedCount);
    check(cached == pool.idle.bytes(), "cached " + pool.idle.bytes() + " != idle segments " + cached);
    check(clientCached == pool.clientCachedBytes, "client-cached bytes " + pool.clientCachedBytes + " != " + clientCached);
    check(cachedByHolder.equals(pool.clientCachedByHolder),
        "client-cached bytes by holder " + pool.clientCachedByHolder + " != " + cachedByHolder);
    check(awaitingEvent == pool.events.bytes(), "awaiting-event bytes " + pool.events.bytes() + " != " + awaitingEvent);
    check(awaitingUnmap == pool.holders.awaitingUnmapBytes(),
        "awaiting-unmap bytes " + pool.holders.awaitingUnmapBytes() + " != " + awaitingUnmap);
    check(pool.reservedBytes <= pool.limitBytes(), "reserved " + pool.reservedBytes + " over limit " + pool.limitBytes());
    check(pool.sharedBlocks >= 0 && pool.sharedBlocks <= pool.activeLeases,
        "shared blocks " + pool.sharedBlocks + " outside 0.." + pool.activeLeases + " leased blocks");
    check(pool.liveHolds >= 0, "live holds " + pool.liveHolds);
    check(pool.publishedBytes >= 0 && pool.publishedBytes <= pool.leasedBytes
        && pool.publishedBytes <= pool.publishedLimitBytes(), "published bytes " + pool.publishedBytes
        + " outside 0..min(leased " + pool.leasedBytes + ", limit " + pool.publishedLimitBytes() + ")");
    check((pool.publishedObjects == 0) == (pool.publishedBytes == 0),
        "published objects " + pool.publishedObjects + " with " + pool.publishedBytes + " published bytes");
  }

  private static void check(boolean condition, String message) {
    if (!condition) {
      throw new AssertionError("pool invariant: " + message);
    }
  }
}
