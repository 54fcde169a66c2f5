package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import java.util.Comparator;
import java.util.TreeSet;

/**
 * The free blocks of one owner in one pool, ordered by (size, block id): one index for the small
 * pool and one for the large pool ({@link SizeClasses}); {@link FreeBlocks} keeps one per owner. Best fit is the smallest free block at least as
 * large as the request; in the large pool a block more than {@code maxOversizeBytes} over the
 * request is not used, so one huge free segment is not chopped up for small neighbours.
 *
 * <p>Guarded by the owning pool's lock ({@link PoolCore#lock}).
 */
final class BlockIndex {
  private static final Comparator<Block> BY_SIZE =
      Comparator.<Block>comparingLong(b -> b.size).thenComparingLong(b -> b.id);

  private final TreeSet<Block> small = new TreeSet<>(BY_SIZE);
  private final TreeSet<Block> large = new TreeSet<>(BY_SIZE);
  /** Reused as the search key; a free block's id never reaches Long.MIN_VALUE. */
  private final Block probe = new Block(null, Long.MIN_VALUE, 0, 0, Block.State.FREE);
  private final long maxOversizeBytes;

  BlockIndex(long maxOversizeBytes) {
    this.maxOversizeBytes = maxOversizeBytes;
  }

  /** Removes and returns the best-fitting free block for a rounded size, or null. */
  Block takeBestFit(long size) {
    boolean isSmall = SizeClasses.isSmall(size);
    TreeSet<Block> index = isSmall ? small : large;
    probe.size = size;
    Block block = index.ceiling(probe);
    // A small-pool block is never larger than its small segment: any of them fits (with a
    // backend granularity over 2 MiB the small segments are larger than largestFit says).
    if (block == null || (!isSmall && block.size > SizeClasses.largestFit(size, maxOversizeBytes))) {
      return null;
    }
    index.remove(block);
    return block;
  }

  /** Adds a free block; its size must not change while it is indexed. */
  void add(Block block) {
    of(block).add(block);
  }

  /** Removes a free block before its size changes or it is leased; true if it was indexed. */
  boolean remove(Block block) {
    return of(block).remove(block);
  }

  boolean contains(Block block) {
    return of(block).contains(block);
  }

  int size() {
    return small.size() + large.size();
  }

  boolean isEmpty() {
    return small.isEmpty() && large.isEmpty();
  }

  /** Every indexed block, small ones first; for {@link PoolInvariants}. */
  void forEach(java.util.function.Consumer<Block> action) {
    small.forEach(action);
    large.forEach(action);
  }

  void clear() {
    small.clear();
    large.clear();
  }

  private TreeSet<Block> of(Block block) {
    return block.segment.small ? small : large;
  }
}
