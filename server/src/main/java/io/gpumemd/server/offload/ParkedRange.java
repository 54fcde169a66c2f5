package io.gpumemd.server.offload;

import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.SegmentMemory;

/**
 * One range of device memory kept in the host store: its bytes in a host buffer of exactly its
 * length, counted against the store's bound until {@link #drop()}. Restoring copies them into a
 * segment at any offset (the range a wake or a lookup gets need not be where it was parked from)
 * and keeps them, so a failed restore can be retried; the caller drops them once restored.
 *
 * <p>Thread-safety: one owner at a time (the sleeping session, the parked object); {@link
 * #drop()} is idempotent.
 */
public final class ParkedRange {
  private final HostStore store;
  private final HostBuffer buffer;
  private final long length;
  private final boolean reusedSpare;
  private boolean dropped;

  private ParkedRange(HostStore store, HostBuffer buffer, long length, boolean reusedSpare) {
    this.store = store;
    this.buffer = buffer;
    this.length = length;
    this.reusedSpare = reusedSpare;
  }

  /**
   * Copies a range out into a spare buffer of its length, or a new one. A spare's bytes were
   * claimed already: the caller's claim gives its share back ({@code true} in the result's
   * {@link #reusedSpare}).
   */
  static ParkedRange copyOut(HostStore store, SegmentMemory segment, long offset, long length) {
    long start = System.nanoTime();
    HostBuffer spare = store.takeSpare(length);
    HostBuffer buffer = spare != null ? spare : store.backend().allocateHost(length);
    try {
      store.backend().copyToHost(segment, offset, buffer, 0, length);
    } catch (RuntimeException e) {
      if (spare != null) {
        store.keepSpare(spare, length);
      } else {
        buffer.free();
      }
      throw e;
    }
    store.parked(System.nanoTime() - start);
    return new ParkedRange(store, buffer, length, spare != null);
  }

  /** Whether its host memory was a spare buffer (already counted against the bound). */
  boolean reusedSpare() {
    return reusedSpare;
  }

  /** Copies the parked bytes into {@code [offset, offset + length())} of a segment. */
  public synchronized void restoreInto(SegmentMemory segment, long offset) {
    if (dropped) {
      throw new IllegalStateException("restoring parked contents that were dropped");
    }
    long start = System.nanoTime();
    store.backend().copyFromHost(buffer, 0, segment, offset, length);
    store.restored(System.nanoTime() - start);
  }

  public long length() {
    return length;
  }

  /**
   * Drops the contents: the host memory becomes a spare for the next park of this length (its
   * bytes stay counted against the store's bound until the store frees it).
   */
  public synchronized void drop() {
    if (!dropped) {
      dropped = true;
      store.keepSpare(buffer, length);
    }
  }
}
