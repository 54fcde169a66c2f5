package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentMemory;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
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
 * <p>A process that was sent the segment's descriptor is a mapper too ({@link
 * DescriptorHolder}): its mapping does not end with its session. It is never asked to unmap;
 * it stops being a mapper when the session it fetched for confirms the unmap (which speaks for
 * its process), or when the fd channel finds that the process no longer reaches the segment
 * ({@link #dropped}, {@link #holderEnded}). What such processes keep of evicted segments counts
 * against their tenant ({@link #pinnedBytes}).
 *
 * <p>Guarded by the owning pool's lock ({@link PoolCore#lock}).
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
   * A process was sent a descriptor of a segment ({@link DescriptorHolder}), which may be null:
   * freed already, and then not tracked (no descriptor of it can be opened either).
   */
  Void descriptorSent(Segment segment, String process) {
    if (segment != null) {
      mapped(segment, process);
    }
    return null;
  }

  /**
   * An evicted segment waits for its mappers to unmap it.
   *
   * @return the holders to ask (sessions; possibly none, when only processes that were sent its
   *     descriptor may map it); null when nobody maps it and it can be freed at once
   */
  Collection<String> awaitUnmaps(Segment segment) {
    if (segment.mappers.isEmpty()) {
      return null;
    }
    segment.state = Segment.State.AWAITING_UNMAP;
    awaitingUnmap.put(segment.id, segment);
    awaitingUnmapBytes += segment.bytes;
    List<String> ask = new ArrayList<>(segment.mappers.size());
    for (String holder : segment.mappers) {
      if (!DescriptorHolder.isKey(holder)) {
        ask.add(holder); // a process that was sent a descriptor cannot be asked: it is watched
      }
    }
    return ask;
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
    return segment != null && vacated(holder, segment) ? segment : null;
  }

  /**
   * A holder no longer maps a segment: it confirmed an unmap the pool asked for ({@link
   * #unmapped}), or it vacated its mapping of a live one as its session went to sleep (the sleep
   * holds the session's leases in it, so no new lease of that session crosses the message).
   *
   * @return true when the segment was evicted and this was its last mapper
   */
  boolean vacated(String holder, Segment segment) {
    // The session speaks for the processes that fetched the segment's descriptor for it: the
    // client library unmaps (and closes the descriptor) before it confirms.
    List<String> processes = new ArrayList<>(0);
    for (String mapper : segment.mappers) {
      if (DescriptorHolder.isKey(mapper) && DescriptorHolder.parse(mapper).session().equals(holder)) {
        processes.add(mapper);
      }
    }
    boolean last = false;
    for (String process : processes) {
      last |= dropped(process, segment);
    }
    return dropped(holder, segment) || last;
  }

  /**
   * A holder no longer maps a segment, whatever the segment's state (the fd channel found that a
   * process reaches it no more).
   *
   * @return the segment, when it was evicted and this was its last mapper; else null
   */
  Segment dropped(String holder, long segmentId) {
    Set<Segment> held = byHolder.get(holder);
    if (held == null) {
      return null;
    }
    for (Segment segment : held) {
      if (segment.id == segmentId) {
        return dropped(holder, segment) ? segment : null;
      }
    }
    return null;
  }

  private boolean dropped(String holder, Segment segment) {
    Set<Segment> held = byHolder.get(holder);
    if (held != null) {
      held.remove(segment);
      if (held.isEmpty()) {
        byHolder.remove(holder);
      }
    }
    return dropMapper(segment, holder);
  }

  /**
   * Bytes of evicted segments that a process of the tenant that was sent their descriptor may
   * still map: memory the daemon cannot free, counted against the tenant's quota.
   */
  long pinnedBytes(String tenant) {
    long bytes = 0;
    for (Segment segment : awaitingUnmap.values()) {
      for (String mapper : segment.mappers) {
        if (DescriptorHolder.isKey(mapper) && DescriptorHolder.parse(mapper).tenant().equals(tenant)) {
          bytes += segment.bytes;
          break;
        }
      }
    }
    return bytes;
  }

  /** The processes that may map a segment of the pool because they were sent its descriptor; a copy. */
  List<String> descriptorHolders() {
    List<String> keys = new ArrayList<>();
    for (String holder : byHolder.keySet()) {
      if (DescriptorHolder.isKey(holder)) {
        keys.add(holder);
      }
    }
    return keys;
  }

  /** The segments a holder may map: their memory by id; a copy. */
  Map<Long, SegmentMemory> segmentsOf(String holder) {
    Map<Long, SegmentMemory> out = new LinkedHashMap<>();
    for (Segment segment : byHolder.getOrDefault(holder, Set.of())) {
      out.put(segment.id, segment.memory);
    }
    return out;
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

  /** Holders that may have mapped a segment; a copy (snapshot). */
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

  /** An evicted segment waiting for its mappers, or null. */
  Segment awaitingUnmap(long segmentId) {
    return awaitingUnmap.get(segmentId);
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
