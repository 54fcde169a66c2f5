package io.gpumemd.server.pool;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Which holders (sessions) may have mapped which segments of one pool, and the evicted
 * segments that wait for their holders to unmap them before they are freed (rule 2 of the
 * README's "The rules that keep memory safe": freeing memory a live client still maps is
 * undefined behaviour in CUDA).
 *
 * <p>A holder becomes a mapper of a segment when it is handed a block of it, and stops being
 * one when it confirms an unmap the pool asked for, or when it ends. An evicted segment
 * without mappers is freed at once; one with mappers waits here, and the call that drops its
 * last mapper returns it to be freed.
 *
 * <p>Guarded by the owning {@link DevicePool}'s lock.
 */
final class HolderMappings {
  private final Map<String, Set<Segment>> byHolder = new HashMap<>();
  private final Map<Long, Segment> awaitingUnmap = new HashMap<>();
  private long awaitingUnmapBytes;

  /** A holder was handed a block of a segment, so it may map it. */
  void mapped(Segment segment, String holder) {
    if (segment.mappers.add(holder)) {
      byHolder.computeIfAbsent(holder, h -> new HashSet<>()).add(segment);
    }
  }

  /**
   * An evicted segment waits for its mappers to unmap it.
   *
   * @return the holders to ask; empty when nobody maps it and it can be freed at once
   */
  Collection<String> awaitUnmaps(Segment segment) {
    if (segment.mappers.isEmpty()) {
      return List.of();
    }
    segment.state = Segment.State.AWAITING_UNMAP;
    awaitingUnmap.put(segment.id, segment);
    awaitingUnmapBytes += segment.bytes;
    return List.copyOf(segment.mappers);
  }

  /**
   * A holder confirms it unmapped a segment. Only segments the pool asked for are affected: a
   * live segment may be handed to the holder again at any time, so its mapping state is not
   * trusted to a message that could cross a new lease in flight.
   *
   * @return the segment, when this was its last mapper and it can now be freed; else null
   */
  Segment unmapped(String holder, long segmentId) {
    Segment segment = awaitingUnmap.get(segmentId);
    if (segment == null) {
      return null;
    }
    Set<Segment> held = byHolder.get(holder);
    if (held != null) {
      held.remove(segment);
    }
    return dropMapper(segment, holder) ? segment : null;
  }

  /** A holder ended: it maps nothing any more. Returns the segments that can now be freed. */
  List<Segment> holderEnded(String holder) {
    Set<Segment> held = byHolder.remove(holder);
    if (held == null) {
      return List.of();
    }
    List<Segment> freed = new ArrayList<>(0);
    for (Segment segment : held) {
      if (dropMapper(segment, holder)) {
        freed.add(segment);
      }
    }
    return freed;
  }

  private boolean dropMapper(Segment segment, String holder) {
    if (segment.mappers.remove(holder) && segment.mappers.isEmpty()
        && segment.state == Segment.State.AWAITING_UNMAP) {
      awaitingUnmap.remove(segment.id);
      awaitingUnmapBytes -= segment.bytes;
      return true;
    }
    return false;
  }

  /** Evicted segments waiting for this holder's unmap (to ask again after a reconnect). */
  List<Long> awaitingUnmapBy(String holder) {
    Set<Segment> held = byHolder.get(holder);
    if (held == null) {
      return List.of();
    }
    List<Long> ids = new ArrayList<>();
    for (Segment segment : held) {
      if (segment.state == Segment.State.AWAITING_UNMAP) {
        ids.add(segment.id);
      }
    }
    return ids;
  }

  /** Holders that may have mapped a segment; a copy (take-over). */
  static List<String> mappersOf(Segment segment) {
    return List.copyOf(segment.mappers);
  }

  /** Every holder that may map a segment of the pool (those that may hold its blocks). */
  List<String> holders() {
    return List.copyOf(byHolder.keySet());
  }

  /** Number of segments a holder may have mapped. */
  int mappedBy(String holder) {
    Set<Segment> held = byHolder.get(holder);
    return held == null ? 0 : held.size();
  }

  Collection<Segment> awaitingUnmap() {
    return awaitingUnmap.values();
  }

  long awaitingUnmapBytes() {
    return awaitingUnmapBytes;
  }

  /** Fills in the figures this class keeps. */
  void report(long[] v) {
    v[PoolMetric.AWAITING_UNMAP_BYTES.ordinal()] = awaitingUnmapBytes;
    v[PoolMetric.SEGMENTS_AWAITING_UNMAP.ordinal()] = awaitingUnmap.size();
  }

  /** Forgets everything: the pool is closing and frees every segment itself. */
  void clear() {
    byHolder.clear();
    awaitingUnmap.clear();
    awaitingUnmapBytes = 0;
  }
}
