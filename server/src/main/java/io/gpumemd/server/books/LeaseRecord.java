package io.gpumemd.server.books;

import io.gpumemd.server.offload.ParkedRange;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.LeasedBlock;

/**
 * One live lease: which session holds which block, since when, why (the tag), and whether it
 * was a pool hit. A record is either a lease (the session leased the block) or a hold (the
 * session attached to another lease's shared block; {@link #attached()}).
 *
 * <p>Immutable but for: the leak-warning flag, which only the reaper thread writes (volatile:
 * a release on another thread reads it); the client-cached flag, guarded by the session; and
 * the sharing state ({@link #shared}, {@link #released}), guarded by this record's monitor, so
 * that a share and the release of the same lease are ordered: a lease is shared before its
 * release (which then drops one hold of several) or not at all; and the sleep state ({@link
 * #asleep}, the block), set under the same monitor, so that a lease goes to sleep or wakes
 * before its release (which then drops its parked contents, or its new block) or not at all.
 */
public final class LeaseRecord {
  private final String id;
  private final LeaseHolder session;
  /** The leased block; while asleep, a detached copy of where it was (no memory of its own). */
  private volatile Block block;
  private final long sizeBytes;
  private final String tag;
  private final long grantedNanos;
  private final long sequence;
  private final boolean poolHit;
  private final boolean attached;
  private final boolean readOnly;
  volatile boolean leakReported;
  /** The holds on the block once it is shared, else null; set under this record's monitor. */
  private volatile SharedBlock shared;
  /** Set, under this record's monitor, when the record is released (it holds nothing after). */
  private boolean released;
  /** Non-null while the lease sleeps; set under this record's monitor. */
  private Asleep asleep;
  /** True while the client keeps the lease closed in its cache tier; guarded by the session. */
  boolean clientCached;

  LeaseRecord(String id, LeaseHolder session, LeasedBlock leased, long sizeBytes, String tag, long grantedNanos, long sequence) {
    this.id = id;
    this.session = session;
    this.block = leased.block();
    this.sizeBytes = sizeBytes;
    this.tag = tag;
    this.grantedNanos = grantedNanos;
    this.sequence = sequence;
    this.poolHit = leased.poolHit();
    this.attached = false;
    this.readOnly = false;
  }

  /** A hold of {@code session} on a shared block. */
  LeaseRecord(String id, LeaseHolder session, SharedBlock shared, boolean readOnly, String tag, long grantedNanos,
      long sequence) {
    this.id = id;
    this.session = session;
    this.block = shared.block();
    this.sizeBytes = shared.sizeBytes();
    this.tag = tag;
    this.grantedNanos = grantedNanos;
    this.sequence = sequence;
    this.poolHit = true;
    this.attached = true;
    this.readOnly = readOnly;
    this.shared = shared;
  }

  /**
   * A lease or hold as restored from a snapshot, on the block found
   * again in the restored pool; {@code shared} is its block's holds, or null when not shared.
   */
  public LeaseRecord(String id, LeaseHolder session, Block block, long sizeBytes, String tag, long grantedNanos, long sequence,
      boolean poolHit, boolean attached, boolean readOnly, SharedBlock shared, boolean clientCached,
      boolean leakReported) {
    this.id = id;
    this.session = session;
    this.block = block;
    this.sizeBytes = sizeBytes;
    this.tag = tag;
    this.grantedNanos = grantedNanos;
    this.sequence = sequence;
    this.poolHit = poolHit;
    this.attached = attached;
    this.readOnly = readOnly;
    this.shared = shared;
    this.clientCached = clientCached;
    this.leakReported = leakReported;
  }

  /** True for a hold on another lease's shared block (Attach or Lookup), false for a lease. */
  public boolean attached() {
    return attached;
  }

  /** True for a read-only hold. */
  public boolean readOnly() {
    return readOnly;
  }

  /** The holds on this record's block when it is shared, else null. */
  public SharedBlock shared() {
    return shared;
  }

  /**
   * The holds on the block, sharing it first if it was not yet shared ({@code onFirstShare}
   * runs then, before any other hold can be taken).
   *
   * @return null when the record was released meanwhile (it has nothing left to share)
   */
  synchronized SharedBlock shareable(Runnable onFirstShare) {
    if (released) {
      return null;
    }
    if (shared == null) {
      shared = new SharedBlock(this);
      onFirstShare.run();
    }
    return shared;
  }

  /** Marks the record released; returns its shared block (to drop a hold from), or null. */
  synchronized SharedBlock markReleased() {
    released = true;
    return shared;
  }

  /**
   * A sleeping lease's contents: the level it sleeps at and, unless dropped (level 2), its bytes
   * in the host store.
   *
   * @param level 1 (contents kept) or 2 (dropped)
   * @param parked the contents in host memory; null when dropped
   */
  public record Asleep(int level, ParkedRange parked) {
    /** Bytes held in host memory. */
    public long hostBytes() {
      return parked == null ? 0 : parked.length();
    }

    /** Frees the host memory, if any (the lease is released, or awake again). */
    public void drop() {
      if (parked != null) {
        parked.drop();
      }
    }
  }

  /** Non-null while the lease sleeps. */
  public synchronized Asleep asleep() {
    return asleep;
  }

  /**
   * The lease goes to sleep, its block still leased (the pool frees it next: {@link #moved}).
   *
   * @return false when it was released meanwhile: the caller drops {@code sleep} and leaves the
   *     block to the release
   */
  public synchronized boolean fallAsleep(Asleep sleep) {
    if (released) {
      return false;
    }
    asleep = sleep;
    return true;
  }

  /** The pool freed the sleeping lease's block: {@code place} is a detached copy of where it was. */
  public void moved(Block place) {
    block = place;
  }

  /**
   * The sleeping lease is awake in {@code woken}, its contents restored; the caller drops what
   * it returns.
   *
   * @return the sleep it woke from; null when the lease was released meanwhile, and then the
   *     caller gives {@code woken} back to its pool
   */
  public synchronized Asleep wake(Block woken) {
    if (released) {
      return null;
    }
    Asleep was = asleep;
    asleep = null;
    block = woken;
    return was;
  }

  /** Whether a possible leak of this lease was reported (read by the snapshot). */
  public boolean leakReported() {
    return leakReported;
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

  public LeaseHolder session() {
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
