package io.gpumemd.server.fd;

import java.util.concurrent.ConcurrentHashMap;

/**
 * Which fd-channel connection each session bound (FdRequest.bind), so that the daemon can push a
 * segment's descriptor there before it sends a Lease reply naming a segment the session's process
 * was not sent yet (see "Pushed descriptors" in {@code gpumemd.proto}). That saves the client
 * the round trip of its FdRequest: the push is in its socket when the reply comes.
 *
 * <p>The Allocator service calls {@link #beforeLeaseReply} with every lease it grants; all the
 * rest (whether the connection was sent the segment already, the channel's bounds, the grant
 * itself) is the connection's ({@link FdConnection#pushBeforeReply}). A session maps to the last
 * connection that bound it; a connection unbinds its sessions when it closes.
 *
 * <p>Thread-safe: a concurrent map; a lease on a session that bound nothing costs one lookup.
 */
public final class DescriptorPushes {
  private final ConcurrentHashMap<String, FdConnection> bound = new ConcurrentHashMap<>();

  /**
   * A lease of {@code sessionId} in {@code segmentId} is about to be answered: pushes the
   * segment's descriptor on the connection the session bound, when it has one that was not sent
   * it yet, and waits (briefly) until it is in the client's socket. Never throws.
   */
  public void beforeLeaseReply(String sessionId, long segmentId) {
    if (bound.isEmpty()) {
      return;
    }
    FdConnection connection = bound.get(sessionId);
    if (connection != null) {
      connection.pushBeforeReply(sessionId, segmentId);
    }
  }

  void bind(String sessionId, FdConnection connection) {
    bound.put(sessionId, connection);
  }

  /** Unbinds {@code sessionId} if {@code connection} is still the one it bound. */
  void unbind(String sessionId, FdConnection connection) {
    bound.remove(sessionId, connection);
  }

  /** Sessions bound to a connection (for tests). */
  int boundSessions() {
    return bound.size();
  }
}
