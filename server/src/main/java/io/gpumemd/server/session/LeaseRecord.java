package io.gpumemd.server.session;

import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.LeasedBlock;

/**
 * One live lease: which session holds which block, since when, why (the tag), and whether it
 * was a pool hit. Immutable but for the leak-warning flag, which only the reaper thread writes
 * (volatile: a release on another thread reads it).
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
  /** True while the client keeps the lease closed in its cache tier; guarded by the session. */
  boolean clientCached;

  LeaseRecord(String id, Session session, LeasedBlock leased, long sizeBytes, String tag, long grantedNanos, long sequence) {
    this.id = id;
    this.session = session;
    this.block = leased.block();
    this.sizeBytes = sizeBytes;
    this.tag = tag;
    this.grantedNanos = grantedNanos;
    this.sequence = sequence;
    this.poolHit = leased.poolHit();
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
