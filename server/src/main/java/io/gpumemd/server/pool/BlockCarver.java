package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.backend.SegmentMemory;
import java.util.Collection;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The live segments of one pool and the blocks carved out of them: what Netty's {@code
 * PoolChunk} is to its arena. It knows nothing of budgets, holders or backends; the pool
 * decides what to lease and when to evict, and this class does the block surgery.
 *
 * <ul>
 *   <li><b>Hit:</b> the owner's best-fitting free block ({@link FreeBlocks}, {@link
 *       BlockIndex}) is taken and leased, split when enough remains ({@link
 *       SizeClasses#shouldSplit}: small 512 B, large over 1 MiB); the rest stays free.
 *   <li><b>Install:</b> a new segment starts as one free block the size of the segment.
 *   <li><b>Give back:</b> a block that is no longer used becomes free and coalesces with its
 *       free neighbours, so that blocks of a segment always alternate free and used; a segment
 *       whose blocks are all free joins the idle list ({@link IdleSegments}): the pool's
 *       <i>cached</i> memory, least recently used first.
 *   <li><b>Retire:</b> an idle segment chosen for eviction leaves the live segments.
 * </ul>
 *
 * <p>It also keeps the lease figures (leased bytes, live leases, their peak), since it makes
 * every block leased; the pool tells it when a leased block stops counting or counts again
 * ({@link #unleased}, {@link #leasedAgain}).
 *
 * <p>Not thread-safe: every method is called with the owning pool's lock ({@link PoolCore#lock}) held.
 */
final class BlockCarver {
  private final ReentrantLock lock;
  /** Free blocks by owner and size; package-private for {@link PoolInvariants} and the tests. */
  final FreeBlocks free;
  final IdleSegments idle = new IdleSegments();
  final Map<Long, Segment> live = new HashMap<>();
  private long nextBlockId = 1;
  private long nextSegmentId;
  private long leasedBytes;
  private long activeLeases;
  private long peakLeasedBytes;

  BlockCarver(ReentrantLock lock, long maxOversizeBytes, long segmentIdBase) {
    this.lock = lock;
    this.free = new FreeBlocks(maxOversizeBytes);
    this.nextSegmentId = segmentIdBase;
  }

  /**
   * A hit: leases the owner's best-fitting free block for a rounded size, split as {@link
   * #carve} does.
   *
   * @return the leased block, or null when the owner has no free block that fits
   */
  Block leaseBestFit(long size, String owner) {
    assert lock.isHeldByCurrentThread();
    Block block = free.takeBestFit(size, owner);
    return block == null ? null : carve(block, size);
  }

  /**
   * Leases a free block (already out of the index) for a rounded size, splitting off what it
   * does not need as a new free block.
   */
  Block carve(Block block, long size) {
    assert lock.isHeldByCurrentThread() && block.state == Block.State.FREE;
    Segment segment = block.segment;
    if (SizeClasses.shouldSplit(block.size, size)) {
      free.add(splitAfter(block, size));
    }
    idle.remove(segment);
    block.state = Block.State.LEASED;
    segment.usedBytes += block.size;
    countLeased(block);
    return block;
  }

  /**
   * Adds a fresh backend allocation as a live segment of the owner.
   *
   * @return its one block, free and not indexed, for {@link #carve}
   */
  Block install(String owner, SegmentMemory memory, boolean small) {
    assert lock.isHeldByCurrentThread();
    Segment segment = new Segment(nextSegmentId++, owner, memory, small);
    Block whole = new Block(segment, nextBlockId++, 0, segment.bytes, Block.State.FREE);
    segment.head = whole;
    live.put(segment.id, segment);
    return whole;
  }

  /**
   * Leases the given ranges of a fresh segment's one block (not indexed; {@link #install}), each
   * at its offset and of exactly its size, and frees the gaps between them: a wake puts a
   * sleeping session's leases back where they were, in a segment of the old one's size.
   *
   * @param ranges offset and size pairs, ordered by offset, not overlapping, inside the block
   * @return the leased blocks, in the order of the ranges
   */
  Block[] carveRanges(Block whole, long[] ranges) {
    assert lock.isHeldByCurrentThread() && whole.state == Block.State.FREE && whole.next == null;
    Block[] leased = new Block[ranges.length / 2];
    Block rest = whole;
    for (int i = 0; i < leased.length; i++) {
      long offset = ranges[2 * i];
      long size = ranges[2 * i + 1];
      if (rest == null || offset < rest.offset || offset + size > rest.offset + rest.size) {
        throw new IllegalArgumentException("range " + offset + "+" + size + " does not fit " + whole.segment);
      }
      if (offset > rest.offset) {
        Block gap = rest;
        rest = splitAfter(gap, offset - gap.offset);
        free.add(gap);
      }
      Block tail = rest.size > size ? splitAfter(rest, size) : null;
      rest.state = Block.State.LEASED;
      rest.segment.usedBytes += size;
      countLeased(rest);
      leased[i] = rest;
      rest = tail;
    }
    if (rest != null) {
      free.add(rest);
    }
    return leased;
  }

  /** Splits a free block after its first {@code size} bytes; returns the second part (free, not indexed). */
  private Block splitAfter(Block block, long size) {
    Block tail = new Block(block.segment, nextBlockId++, block.offset + size, block.size - size, Block.State.FREE);
    tail.prev = block;
    tail.next = block.next;
    if (block.next != null) {
      block.next.prev = tail;
    }
    block.next = tail;
    block.size = size;
    return tail;
  }

  /** A leased block stops counting as leased: released, or kept in its client's cache. */
  void unleased(Block block) {
    assert lock.isHeldByCurrentThread() && block.state == Block.State.LEASED;
    leasedBytes -= block.size;
    activeLeases--;
  }

  /** A block its client kept in its cache is leased again. */
  void leasedAgain(Block block) {
    assert lock.isHeldByCurrentThread();
    block.state = Block.State.LEASED;
    countLeased(block);
  }

  private void countLeased(Block block) {
    leasedBytes += block.size;
    activeLeases++;
    peakLeasedBytes = Math.max(peakLeasedBytes, leasedBytes);
  }

  /**
   * Makes a no-longer-used block free again: coalesces it with free neighbours and indexes the
   * result. Nothing but the block's state changes when its segment is no longer live (the pool
   * was closed under it).
   *
   * @return true when its segment became idle (wholly free), so the retention cap applies
   */
  boolean giveBack(Block block) {
    assert lock.isHeldByCurrentThread();
    Segment segment = block.segment;
    block.state = Block.State.FREE;
    segment.usedBytes -= block.size;
    if (segment.state != Segment.State.LIVE) {
      return false;
    }
    Block prev = block.prev;
    if (prev != null && prev.state == Block.State.FREE) {
      free.remove(prev);
      prev.size += block.size;
      unlink(block);
      block = prev;
    }
    Block next = block.next;
    if (next != null && next.state == Block.State.FREE) {
      free.remove(next);
      block.size += next.size;
      unlink(next);
    }
    free.add(block);
    if (segment.idle()) {
      idle.add(segment);
      return true;
    }
    return false;
  }

  private static void unlink(Block block) {
    block.prev.next = block.next;
    if (block.next != null) {
      block.next.prev = block.prev;
    }
    block.prev = null;
    block.next = null;
  }

  /** Removes and returns the least recently used idle segment, or null; see {@link #retire}. */
  Segment pollIdle() {
    assert lock.isHeldByCurrentThread();
    return idle.pollLeastRecent();
  }

  /** Takes an idle segment (already out of the idle list) out of the live segments. */
  void retire(Segment segment) {
    assert lock.isHeldByCurrentThread();
    Block whole = segment.head;
    assert whole.state == Block.State.FREE && whole.next == null && whole.size == segment.bytes
        : "evicting a segment that is not wholly free: " + segment;
    free.remove(whole);
    live.remove(segment.id);
  }

  /** The blocks of a live segment by offset; empty when it is not live. */
  Map<Long, Block> blocksOf(long segmentId) {
    assert lock.isHeldByCurrentThread();
    Segment segment = live.get(segmentId);
    Map<Long, Block> byOffset = new HashMap<>();
    for (Block b = segment == null ? null : segment.head; b != null; b = b.next) {
      byOffset.put(b.offset, b);
    }
    return byOffset;
  }

  // ------------------------------------------------------------------ restore (PoolRestorer)

  /** A restored pool goes on with the segment ids of the pool it was written down from. */
  void continueSegmentIds(long next) {
    assert lock.isHeldByCurrentThread() && live.isEmpty();
    nextSegmentId = next;
  }

  /** The id the next new segment gets. */
  long nextSegmentId() {
    return nextSegmentId;
  }

  long peakLeasedBytes() {
    return peakLeasedBytes;
  }

  /**
   * Restores the peak of the pool restored from once its blocks are back: its own figure, since the
   * restore counted client-cached blocks as leased on their way (never below what is leased).
   */
  void restorePeak(long peak) {
    peakLeasedBytes = Math.max(peak, leasedBytes);
  }

  /**
   * Re-creates a segment of the pool restored from, with no blocks yet ({@link #restoreBlock}); a live one
   * joins the live segments.
   */
  Segment restoreSegment(long id, String owner, SegmentMemory memory, boolean small, boolean live) {
    assert lock.isHeldByCurrentThread();
    Segment segment = new Segment(id, owner, memory, small);
    if (live) {
      this.live.put(id, segment);
    }
    return segment;
  }

  /**
   * Appends a block of the pool restored from after {@code prev} (null: the segment's first): a free
   * block is indexed (when {@code indexed}), a leased one counts as leased. A client-cached block
   * is restored leased, then handed to {@link ClientCacheBooks#cached}.
   */
  Block restoreBlock(Segment segment, Block prev, long offset, long size, boolean free, boolean indexed) {
    assert lock.isHeldByCurrentThread();
    Block block = new Block(segment, nextBlockId++, offset, size, free ? Block.State.FREE : Block.State.LEASED);
    block.prev = prev;
    if (prev == null) {
      segment.head = block;
    } else {
      prev.next = block;
    }
    if (free) {
      if (indexed) {
        this.free.add(block);
      }
    } else {
      segment.usedBytes += size;
      countLeased(block);
    }
    return block;
  }

  /** Puts a restored, wholly free segment last in the idle order (least recently used first). */
  void restoreIdle(Segment segment) {
    assert lock.isHeldByCurrentThread();
    idle.add(segment);
  }

  /** Bytes of the idle segments: the pool's cached bytes. */
  long cachedBytes() {
    return idle.bytes();
  }

  long leasedBytes() {
    return leasedBytes;
  }

  long activeLeases() {
    return activeLeases;
  }

  /** Fills in the figures this class keeps. */
  void report(long[] v) {
    v[PoolMetric.LEASED_BYTES.ordinal()] = leasedBytes;
    v[PoolMetric.PEAK_LEASED_BYTES.ordinal()] = peakLeasedBytes;
    v[PoolMetric.ACTIVE_LEASES.ordinal()] = activeLeases;
    v[PoolMetric.CACHED_BYTES.ordinal()] = idle.bytes();
    v[PoolMetric.CACHED_BLOCKS.ordinal()] = free.size();
    v[PoolMetric.SEGMENTS.ordinal()] = live.size();
  }

  /**
   * Forgets every segment and block: the pool is closing and frees the segments itself. The
   * lease figures stay: blocks still leased are released later, and settle them.
   *
   * @return the segments that were live
   */
  Collection<Segment> clear() {
    assert lock.isHeldByCurrentThread();
    Collection<Segment> all = live.values().stream().toList();
    live.clear();
    idle.clear();
    free.clear();
    return all;
  }
}
