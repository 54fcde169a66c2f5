package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentMemory;
import java.util.HashSet;
import java.util.Set;

/**
 * One backend allocation as the pool sees it: its owner, its blocks in address order, the bytes
 * in use, and the holders (sessions) that may have mapped it. The owner is fixed for the
 * segment's life: its blocks are leased only for that owner ({@link FreeBlocks}). All mutable
 * fields are guarded by the owning pool's lock ({@link PoolCore#lock}).
 */
final class Segment {
  enum State { LIVE, AWAITING_UNMAP, FREED }

  final long id;
  /** Key of the {@link io.gpumemd.server.backend.SegmentOwner} it was allocated for. */
  final String owner;
  final SegmentMemory memory;
  final long bytes;
  final boolean small;
  /** First block by address. */
  Block head;
  /** Bytes of blocks that are not free (leased, or waiting for an event). */
  long usedBytes;
  State state = State.LIVE;
  /** Holders that were handed a lease on this segment and have not confirmed an unmap. */
  final Set<String> mappers = new HashSet<>(4);

  Segment(long id, String owner, SegmentMemory memory, boolean small) {
    this.id = id;
    this.owner = owner;
    this.memory = memory;
    this.bytes = memory.bytes();
    this.small = small;
  }

  boolean idle() {
    return usedBytes == 0;
  }

  @Override
  public String toString() {
    return "Segment[" + id + ", owner='" + owner + "', " + bytes + " bytes, used=" + usedBytes + ", " + state + "]";
  }
}
