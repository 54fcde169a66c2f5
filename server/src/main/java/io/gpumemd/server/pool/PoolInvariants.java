package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import java.util.HashMap;
import java.util.Map;
import java.util.function.Supplier;

/**
 * The structural invariants of a {@link DevicePool}, checked by tests after every operation
 * they care about: blocks tile each segment without gaps or overlaps, free neighbours are
 * coalesced, the free index holds exactly the free blocks, each in the index of its segment's
 * owner (and no owner keeps an empty index), the idle list exactly the wholly
 * free segments, and every byte counter agrees with the blocks:
 * {@code reserved = leased + client_cached + cached + remainder + awaiting_event + awaiting_unmap <= limit}.
 *
 * <p>Reads the books of a {@link PoolCore}, with its lock held.
 */
final class PoolInvariants {
  /** What the walk over the blocks of the live segments found. */
  private static final class Found {
    long segmentBytes;
    long leased;
    long leasedCount;
    long cached;
    long awaitingEvent;
    long clientCached;
    long freeBlocks;
    final Map<String, Long> clientCachedByHolder = new HashMap<>();
  }

  private PoolInvariants() {}

  /** Throws {@link AssertionError} describing the first violation. */
  static void verify(PoolCore core) {
    assert core.lock.isHeldByCurrentThread();
    Found found = new Found();
    for (Segment s : core.carver.live.values()) {
      verifySegment(core, s, found);
    }
    check(core.carver.idle.size() <= core.carver.live.size(), "idle list holds dead segments");
    long awaitingUnmap = 0;
    for (Segment s : core.holders.awaitingUnmap()) {
      found.segmentBytes += s.bytes;
      awaitingUnmap += s.bytes;
      check(s.state == Segment.State.AWAITING_UNMAP, () -> "segment awaiting unmap in state " + s.state);
      check(!s.mappers.isEmpty(), () -> "awaiting-unmap segment without mappers: " + s);
    }
    check(awaitingUnmap == core.holders.awaitingUnmapBytes(),
        "awaiting-unmap bytes " + core.holders.awaitingUnmapBytes() + " != " + awaitingUnmap);
    verifyFreeIndex(core, found.freeBlocks);
    verifyBooks(core, found);
    verifySharing(core);
  }

  /** The blocks of one live segment, added to what was found. */
  private static void verifySegment(PoolCore core, Segment s, Found found) {
    check(s.state == Segment.State.LIVE, () -> "live segment in state " + s.state);
    found.segmentBytes += s.bytes;
    long expectOffset = 0;
    long used = 0;
    Block prev = null;
    for (Block b = s.head; b != null; b = b.next) {
      if (b.prev != prev) {
        fail("broken prev link at " + b);
      }
      if (b.offset != expectOffset) {
        fail("gap or overlap at " + b + " (expected offset " + expectOffset + ")");
      }
      if (b.size <= 0 || b.size % SizeClasses.ALIGNMENT != 0) {
        fail("bad size " + b);
      }
      expectOffset += b.size;
      switch (b.state) {
        case FREE -> {
          if (!core.carver.free.contains(b)) {
            fail("free block not indexed: " + b);
          }
          if (prev != null && prev.state == Block.State.FREE) {
            fail("uncoalesced free neighbours at " + b);
          }
          found.freeBlocks++;
        }
        case LEASED -> {
          found.leased += b.size;
          found.leasedCount++;
          used += b.size;
        }
        case CLIENT_CACHED -> {
          found.clientCached += b.size;
          used += b.size;
          if (b.cachedBy == null) {
            fail("client-cached block without its holder: " + b);
          }
          found.clientCachedByHolder.merge(b.cachedBy, b.size, Long::sum);
        }
        case AWAITING_EVENT -> {
          found.awaitingEvent += b.size;
          used += b.size;
        }
      }
      prev = b;
    }
    check(expectOffset == s.bytes, () -> "blocks do not cover " + s);
    long usedFound = used;
    check(used == s.usedBytes, () -> "used bytes " + s.usedBytes + " != " + usedFound + " in " + s);
    check(s.idle() == core.carver.idle.contains(s), () -> "idle list disagrees for " + s);
    if (s.idle()) {
      found.cached += s.bytes;
    }
  }

  /** Every owner's index holds only free blocks of that owner's live segments, and all of them. */
  private static void verifyFreeIndex(PoolCore core, long freeBlocks) {
    FreeBlocks free = core.carver.free;
    check(freeBlocks == free.size(), "index holds blocks that are not free");
    int indexed = 0;
    for (var entry : free.byOwner().entrySet()) {
      String owner = entry.getKey();
      BlockIndex index = entry.getValue();
      check(!index.isEmpty(), () -> "empty free index kept for owner '" + owner + "'");
      indexed += index.size();
      index.forEach(b -> {
        // A block in another owner's index could be leased to that owner: the isolation rule.
        check(b.segment.owner.equals(owner),
            () -> "free " + b + " of " + b.segment + " in the index of owner '" + owner + "'");
        check(b.state == Block.State.FREE, () -> "indexed block is not free: " + b);
        check(b.segment.state == Segment.State.LIVE && core.carver.live.get(b.segment.id) == b.segment, () ->
            "indexed block of a segment that is not live: " + b);
      });
    }
    check(indexed == free.size(), "free index count " + free.size() + " != indexed blocks " + indexed);
  }

  /** The byte figures of the rooms agree with the blocks. */
  private static void verifyBooks(PoolCore core, Found found) {
    long reserved = core.budget.reservedBytes();
    long leased = core.carver.leasedBytes();
    check(found.segmentBytes == reserved, "reserved " + reserved + " != segments " + found.segmentBytes);
    check(found.leased == leased, "leased " + leased + " != blocks " + found.leased);
    check(found.leasedCount == core.carver.activeLeases(), "active leases " + core.carver.activeLeases() + " != "
        + found.leasedCount);
    check(found.cached == core.carver.cachedBytes(), "cached " + core.carver.cachedBytes() + " != idle segments "
        + found.cached);
    check(found.clientCached == core.clientCache.bytes(), "client-cached bytes " + core.clientCache.bytes() + " != "
        + found.clientCached);
    check(found.clientCachedByHolder.equals(core.clientCache.byHolder()),
        "client-cached bytes by holder " + core.clientCache.byHolder() + " != " + found.clientCachedByHolder);
    check(found.awaitingEvent == core.events.bytes(), "awaiting-event bytes " + core.events.bytes() + " != "
        + found.awaitingEvent);
    check(reserved <= core.budget.limitBytes(), "reserved " + reserved + " over limit " + core.budget.limitBytes());
  }

  /** The sharing figures are within their bounds (exact under the lock: see {@link SharingCounters}). */
  private static void verifySharing(PoolCore core) {
    SharingCounters sharing = core.sharing;
    long sharedBlocks = sharing.sharedBlocks();
    long activeLeases = core.carver.activeLeases();
    long publishedBytes = sharing.publishedBytes();
    long publishedObjects = sharing.publishedObjects();
    long leased = core.carver.leasedBytes();
    check(sharedBlocks >= 0 && sharedBlocks <= activeLeases,
        "shared blocks " + sharedBlocks + " outside 0.." + activeLeases + " leased blocks");
    check(sharing.liveHolds() >= 0, "live holds " + sharing.liveHolds());
    check(publishedBytes >= 0 && publishedBytes <= leased && publishedBytes <= sharing.publishedLimitBytes(),
        "published bytes " + publishedBytes + " outside 0..min(leased " + leased + ", limit "
        + sharing.publishedLimitBytes() + ")");
    check((publishedObjects == 0) == (publishedBytes == 0),
        "published objects " + publishedObjects + " with " + publishedBytes + " published bytes");
    long sleeping = sharing.sleepingPublishedBytes();
    check(sleeping >= 0 && publishedBytes + sleeping <= sharing.publishedLimitBytes(),
        "sleeping published bytes " + sleeping + " outside 0..limit " + sharing.publishedLimitBytes()
        + " - published " + publishedBytes);
  }

  private static void check(boolean condition, String message) {
    if (!condition) {
      fail(message);
    }
  }

  private static void fail(String message) {
    throw new AssertionError("pool invariant: " + message);
  }

  /**
   * As {@link #check(boolean, String)}, the message made only on a violation: a restore checks
   * every block of a node's pool inside the take-over's pause, where building a message per
   * block (10,000 leases) took 12 to 45 ms of it.
   */
  private static void check(boolean condition, Supplier<String> message) {
    if (!condition) {
      fail(message.get());
    }
  }
}
