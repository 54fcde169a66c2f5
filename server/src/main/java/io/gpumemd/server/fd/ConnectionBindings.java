package io.gpumemd.server.fd;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The sessions one fd-channel connection bound, and for each the segments it was sent on that
 * connection (pushed or fetched): a segment is pushed only once per session and connection, the
 * client keeping its mapping for the session's life. What is remembered is bounded: at most
 * {@link #MAX_SESSIONS} sessions (binding one more unbinds the oldest) and {@link
 * #MAX_SEGMENTS} segments per session (past it the session's set starts over, and a segment
 * may be pushed again: the client closes a descriptor it has no use for).
 *
 * <p>Thread-safe (its monitor): the Allocator service's threads ask {@link #firstSend}, the
 * connection's event loop binds and records fetches.
 */
final class ConnectionBindings {
  static final int MAX_SESSIONS = 8;
  static final int MAX_SEGMENTS = 4096;

  /** A bound session: its bind's request id (which its pushes carry) and what it was sent. */
  private record Bound(long bindRequestId, Set<Long> sent) {}

  private final LinkedHashMap<String, Bound> sessions = new LinkedHashMap<>(); // guarded by this

  /**
   * Binds {@code sessionId} by the request {@code bindRequestId} (again: its pushes carry the
   * new id from now on); returns the session unbound to make room, or null.
   */
  synchronized String bind(String sessionId, long bindRequestId) {
    Bound before = sessions.remove(sessionId);
    String evicted = null;
    if (before == null && sessions.size() >= MAX_SESSIONS) {
      Iterator<Map.Entry<String, Bound>> oldest = sessions.entrySet().iterator();
      evicted = oldest.next().getKey();
      oldest.remove();
    }
    sessions.put(sessionId, new Bound(bindRequestId, before != null ? before.sent() : new HashSet<>()));
    return evicted;
  }

  /**
   * When {@code sessionId} is bound here and was not sent {@code segmentId} on this connection
   * yet: the request id of its bind, and the segment counted as sent (the caller pushes it, or
   * {@link #forget}s it). Else -1.
   */
  synchronized long firstSend(String sessionId, long segmentId) {
    Bound bound = sessions.get(sessionId);
    if (bound == null) {
      return -1;
    }
    Set<Long> sent = bound.sent();
    if (sent.size() >= MAX_SEGMENTS && !sent.contains(segmentId)) {
      sent.clear();
    }
    return sent.add(segmentId) ? bound.bindRequestId() : -1;
  }

  /** A fetch of a bound session was granted: no need to push it that segment later. */
  synchronized void fetched(String sessionId, long segmentId) {
    firstSend(sessionId, segmentId);
  }

  /** A push counted by {@link #firstSend} did not go out. */
  synchronized void forget(String sessionId, long segmentId) {
    Bound bound = sessions.get(sessionId);
    if (bound != null) {
      bound.sent().remove(segmentId);
    }
  }

  synchronized List<String> sessions() {
    return new ArrayList<>(sessions.keySet());
  }
}
