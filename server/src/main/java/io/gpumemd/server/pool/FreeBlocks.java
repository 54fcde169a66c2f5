package io.gpumemd.server.pool;

import java.util.Collections;
import java.util.HashMap;
import java.util.Map;

/**
 * The free blocks of one pool, one {@link BlockIndex} per segment owner, so that a best fit for
 * one owner never finds a block of another ({@link io.gpumemd.server.backend.SegmentOwner}: a
 * segment only ever carves blocks for the owner it was allocated for). A block's owner is its
 * segment's.
 *
 * <p>An owner's index exists only while it holds a free block: it is dropped when it empties,
 * so owners that come and go (sessions, tenants) leave nothing behind. The hit path costs one
 * hash look-up more than a single index.
 *
 * <p>Guarded by the owning pool's lock ({@link PoolCore#lock}).
 */
final class FreeBlocks {
  private final Map<String, BlockIndex> byOwner = new HashMap<>();
  private final long maxOversizeBytes;
  private int size;

  long maxOversizeBytes() {
    return maxOversizeBytes;
  }

  /** @param maxOversizeBytes the large-pool oversize rule of every owner's index */
  FreeBlocks(long maxOversizeBytes) {
    this.maxOversizeBytes = maxOversizeBytes;
  }

  /** Removes and returns the best-fitting free block of an owner for a rounded size, or null. */
  Block takeBestFit(long size, String owner) {
    BlockIndex index = byOwner.get(owner);
    if (index == null) {
      return null;
    }
    Block block = index.takeBestFit(size);
    if (block != null) {
      this.size--;
      dropIfEmpty(owner, index);
    }
    return block;
  }

  /** Adds a free block to its segment owner's index; its size must not change while indexed. */
  void add(Block block) {
    byOwner.computeIfAbsent(block.segment.owner, o -> new BlockIndex(maxOversizeBytes)).add(block);
    size++;
  }

  /** Removes a free block before its size changes or it is leased. */
  void remove(Block block) {
    String owner = block.segment.owner;
    BlockIndex index = byOwner.get(owner);
    if (index != null && index.remove(block)) {
      size--;
      dropIfEmpty(owner, index);
    }
  }

  boolean contains(Block block) {
    BlockIndex index = byOwner.get(block.segment.owner);
    return index != null && index.contains(block);
  }

  /** Free blocks of every owner. */
  int size() {
    return size;
  }

  void clear() {
    byOwner.clear();
    size = 0;
  }

  /** The indexes by owner, read-only; for {@link PoolInvariants}. */
  Map<String, BlockIndex> byOwner() {
    return Collections.unmodifiableMap(byOwner);
  }

  private void dropIfEmpty(String owner, BlockIndex index) {
    if (index.isEmpty()) {
      byOwner.remove(owner);
    }
  }
}
