package io.gpumemd.server.backend;

/**
 * A client's CUDA IPC event opened by the daemon: a released block is reused only once the
 * event recorded after the client's last use has completed (README, "The rules that keep
 * memory safe", rule 3). Not thread-safe: the pool polls each one from one thread at a time.
 */
public interface CompletionEvent extends AutoCloseable {
  /**
   * True once the event has completed, false while it has not.
   *
   * @throws BackendException when the event cannot be queried (a CUDA error): that says nothing
   *     about the work the event follows, so it must never be taken for completion
   */
  boolean isComplete();

  /** Releases the daemon's handle on the event. Idempotent. */
  @Override
  void close();
}
