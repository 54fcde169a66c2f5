package io.gpumemd.client;

import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Descriptors the daemon pushed on the fd channel (see "Pushed descriptors" in {@code
 * gpumemd.proto}) and nobody took yet, by session and segment: the daemon pushes a segment new
 * to a session before the Lease reply that names it, and the session's mapping cache then takes
 * it here instead of asking. At most {@link #MAX_KEPT}: a push for a segment already mapped
 * (the daemon's view lags the client's) is never taken, and the oldest is closed to make room.
 *
 * <p>Not thread-safe: the {@link FdChannelClient}'s lock guards it.
 */
final class PushedDescriptors implements AutoCloseable {
  static final int MAX_KEPT = 16;

  private final Map<String, ReceivedDescriptor> kept = new LinkedHashMap<>();

  private static String key(String sessionId, long segmentId) {
    return Long.toUnsignedString(segmentId) + "/" + sessionId;
  }

  /** Keeps a pushed descriptor for {@code sessionId}; one for the same segment before is closed. */
  void keep(String sessionId, ReceivedDescriptor descriptor) {
    ReceivedDescriptor before = kept.put(key(sessionId, descriptor.segmentId()), descriptor);
    if (before != null) {
      before.close();
    }
    if (kept.size() > MAX_KEPT) {
      Iterator<ReceivedDescriptor> oldest = kept.values().iterator();
      oldest.next().close();
      oldest.remove();
    }
  }

  /**
   * The descriptor pushed for the segment and session, or null: a read-only one serves any
   * mapping (the daemon grants only that), a writable one only a writable mapping.
   */
  ReceivedDescriptor take(String sessionId, long segmentId, boolean readOnly) {
    if (kept.isEmpty()) {
      return null;
    }
    String key = key(sessionId, segmentId);
    ReceivedDescriptor descriptor = kept.get(key);
    if (descriptor == null || (readOnly && !descriptor.readOnly())) {
      return null;
    }
    kept.remove(key);
    return descriptor;
  }

  /** Descriptors kept (for tests). */
  int size() {
    return kept.size();
  }

  /** Closes every descriptor kept. Idempotent. */
  @Override
  public void close() {
    kept.values().forEach(ReceivedDescriptor::close);
    kept.clear();
  }
}
