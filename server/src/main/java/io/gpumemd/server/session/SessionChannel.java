package io.gpumemd.server.session;

/**
 * The server-to-client half of a session's KeepAlive stream, as the domain sees it. The gRPC
 * layer implements it over the stream.
 *
 * <p>Implementations are thread-safe and never block: events are pushed from any thread.
 */
public interface SessionChannel {
  /** Asks the client to unmap a segment and acknowledge. */
  void requestUnmap(int device, long segmentId);

  /** Asks the client to release its cached blocks on a device: at least {@code bytes}, all if 0. */
  void returnCache(int device, long bytes);

  /** Tells the client its cache allowance is now {@code bytes}. */
  void cacheAllowance(long bytes);

  /**
   * Asks the client to sleep ({@code wake} false, at {@code level}, with {@code tags}) or wake its
   * session for an admin; it answers with a Sleep or Wake naming {@code requestId} ({@link SleepAsks}).
   */
  void sleepAsked(long requestId, boolean wake, int level, java.util.List<String> tags);

  /** Tells the client the server is draining and frees everything in {@code drainMillis}. */
  void shutdownNotice(long drainMillis);

  /**
   * Tells the client the session moved to another daemon (it took this one's place), then ends the stream:
   * the client reattaches the same session there.
   */
  default void moving() {
    close();
  }

  /**
   * Tells the client that a successor is about to take the session over and listens on the Unix
   * socket {@code socketName}, beside the daemon's, until it serves on the daemon's socket: the
   * client may connect there before the pause; an empty name, that the successor went away
   * (the client drops that connection). Changes nothing here.
   */
  default void successorAt(String socketName) {}

  /** Ends the stream (the session ended, or a newer stream replaced this one). */
  void close();
}
