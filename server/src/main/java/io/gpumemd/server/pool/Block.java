package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentMemory;

/**
 * A byte range inside a segment: free (cached), leased, leased but kept closed in its client's
 * cache tier (client-cached), or released but waiting for the client's completion event. Blocks of a segment form a doubly linked list in address order so
 * that a released block can coalesce with free neighbours.
 *
 * <p>All mutable fields are guarded by the owning pool's lock ({@link PoolCore#lock}). Outside the pool
 * a leased block is read-only: its segment, offset and size do not change while it is leased.
 */
public final class Block {
  enum State { FREE, LEASED, CLIENT_CACHED, AWAITING_EVENT }

  final Segment segment;
  final long id;
  long offset;
  long size;
  State state;
  Block prev;
  Block next;
  /** The holder keeping the block in its client cache, while {@code CLIENT_CACHED}. */
  String cachedBy;

  Block(Segment segment, long id, long offset, long size, State state) {
    this.segment = segment;
    this.id = id;
    this.offset = offset;
    this.size = size;
    this.state = state;
  }

  /** Device ordinal. */
  public int device() {
    return segment.memory.device();
  }

  /** Stable id of the segment holding the block. */
  public long segmentId() {
    return segment.id;
  }

  /** Bytes of the whole segment. */
  public long segmentBytes() {
    return segment.bytes;
  }

  /** The backend allocation (with its IPC handle). */
  public SegmentMemory memory() {
    return segment.memory;
  }

  /** Offset of the block in its segment. */
  public long offset() {
    return offset;
  }

  /**
   * FREE, LEASED, CLIENT_CACHED or AWAITING_EVENT. Read without the pool's lock: for checks made
   * while nothing else runs on the pool (a restore from a snapshot, before the daemon serves).
   */
  public String stateName() {
    return state.name();
  }

  /** Bytes of the block (the request rounded to the pool's classes). */
  public long size() {
    return size;
  }

  /**
   * Where the block is, as a sleeping lease keeps it: a copy of its place that no pool book
   * links, so what becomes of the block once freed (coalesced, reused) does not change it.
   * Under the pool's lock, while the block is still leased.
   */
  Block detached() {
    return new Block(segment, id, offset, size, state);
  }

  /** Whether the block's segment serves small requests ({@link io.gpumemd.common.SizeClasses#isSmall}). */
  public boolean smallSegment() {
    return segment.small;
  }

  @Override
  public String toString() {
    return "Block[segment=" + segment.id + ", offset=" + offset + ", size=" + size + ", " + state + "]";
  }
}
