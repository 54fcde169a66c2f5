package io.gpumemd.server.pool;

/**
 * What one pool holds from its backend, measured against its budget: <i>reserved</i> bytes
 * (segments the backend holds for the pool: live, or evicted and waiting for unmaps), bytes
 * <i>in flight</i> (backend allocations under way, not yet installed) and bytes <i>freeing</i>
 * (segments the pool gave up whose backend free has not finished). The budget bounds {@code
 * reserved + in flight}; a miss allocates only when its segment fits too.
 *
 * <p>Not thread-safe: every method is called with the owning pool's lock ({@link PoolCore#lock}) held.
 */
final class Budget {
  private final long limitBytes;
  private long reservedBytes;
  private long inFlightBytes;
  private long freeingBytes;

  Budget(long limitBytes) {
    this.limitBytes = limitBytes;
  }

  /** Whether a segment of {@code bytes} may be allocated now. */
  boolean fits(long bytes) {
    return reservedBytes + inFlightBytes + bytes <= limitBytes;
  }

  /**
   * Whether a segment of {@code bytes} would fit once {@code comingBack} bytes are given up
   * (evicted idle segments, segments awaiting unmaps, blocks clients keep cached).
   */
  boolean fitsWithout(long comingBack, long bytes) {
    return reservedBytes - comingBack + inFlightBytes + bytes <= limitBytes;
  }

  /** A backend allocation of {@code bytes} starts. */
  void allocating(long bytes) {
    inFlightBytes += bytes;
  }

  /** A backend allocation ended, failed or not; see {@link #installed}. */
  void allocationEnded(long bytes) {
    inFlightBytes -= bytes;
  }

  /** A segment the backend allocated joined the pool. */
  void installed(long bytes) {
    reservedBytes += bytes;
  }

  /** The pool gave up a segment; its backend free runs after the lock is released. */
  void freeing(long bytes) {
    reservedBytes -= bytes;
    freeingBytes += bytes;
  }

  /** The backend has freed a segment the pool gave up. */
  void freed(long bytes) {
    freeingBytes -= bytes;
  }

  /** The pool closed: it frees every segment itself, and holds nothing any more. */
  void closed() {
    reservedBytes = 0;
  }

  /** Fills in the figures this class keeps. */
  void report(long[] v) {
    v[PoolMetric.RESERVED_BYTES.ordinal()] = reservedBytes;
    v[PoolMetric.LIMIT_BYTES.ordinal()] = limitBytes;
  }

  long limitBytes() {
    return limitBytes;
  }

  long reservedBytes() {
    return reservedBytes;
  }

  long inFlightBytes() {
    return inFlightBytes;
  }

  long freeingBytes() {
    return freeingBytes;
  }
}
