package io.gpumemd.server.pool;

import java.util.Iterator;
import java.util.LinkedHashSet;

/**
 * The wholly free segments of one pool, least recently used first, and their bytes: the
 * pool's <i>cached</i> memory, what eviction gives back first. A segment joins when its last
 * block is returned and leaves when a block of it is leased again or it is evicted.
 *
 * <p>Guarded by the owning pool's lock ({@link PoolCore#lock}).
 */
final class IdleSegments {
  private final LinkedHashSet<Segment> lru = new LinkedHashSet<>();
  private long bytes;

  /** A segment became wholly free: it is now the most recently used. */
  void add(Segment segment) {
    if (lru.add(segment)) {
      bytes += segment.bytes;
    }
  }

  /** A segment is in use again (or gone); true if it was idle. */
  boolean remove(Segment segment) {
    if (lru.remove(segment)) {
      bytes -= segment.bytes;
      return true;
    }
    return false;
  }

  /** Removes and returns the least recently used idle segment, or null when there is none. */
  Segment pollLeastRecent() {
    Iterator<Segment> it = lru.iterator();
    if (!it.hasNext()) {
      return null;
    }
    Segment segment = it.next();
    it.remove();
    bytes -= segment.bytes;
    return segment;
  }

  /** The idle segments, least recently used first; a copy (snapshot). */
  java.util.List<Segment> inOrder() {
    return java.util.List.copyOf(lru);
  }

  boolean contains(Segment segment) {
    return lru.contains(segment);
  }

  /** Bytes of every idle segment: the cached bytes. */
  long bytes() {
    return bytes;
  }

  int size() {
    return lru.size();
  }

  void clear() {
    lru.clear();
    bytes = 0;
  }
}
