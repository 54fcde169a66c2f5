package io.gpumemd.server.session;

import io.gpumemd.server.pool.Block;

/**
 * One live lease: which session holds which block, since when, and why (the tag). Immutable
 * but for the leak-warning flag, which only the reaper thread writes.
 */
public final class LeaseRecord {
  private final String id;
  private final Session session;
  private final Block block;
  private final long sizeBytes;
  private final String tag;
  private final long grantedNanos;
  private final long sequence;
  private final boolean poolHit;
  volatile boolean leakReported;

  LeaseRecord(String id, Session session, Block block, long sizeBytes, String tag, long grantedNanos, long sequence) {
    this.id = id;
    this.session = session;
    this.block = block;
    this.sizeBytes = sizeBytes;
    this.tag = tag;
    this.grantedNanos = grantedNanos;
    this.sequence = sequence;
    // Captured now: the block's own flag belongs to whoever leases it next, which can happen
    // as soon as this lease is released, even before our response has been recorded.
    this.poolHit = block.poolHit();
  }

  /** Whether this lease was served from cached memory. */
  public boolean poolHit() {
    return poolHit;
  }

  /** Order of grant, daemon-wide: listings sort by it (timestamps can tie). */
  public long sequence() {
    return sequence;
  }

  public String id() {
    return id;
  }

  public Session session() {
    return session;
  }

  public Block block() {
    return block;
  }

  /** Bytes requested. */
  public long sizeBytes() {
    return sizeBytes;
  }

  public String tag() {
    return tag;
  }

  public long grantedNanos() {
    return grantedNanos;
  }
}
