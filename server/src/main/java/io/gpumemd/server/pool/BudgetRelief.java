package io.gpumemd.server.pool;

/**
 * What a miss asks before it refuses a lease for lack of budget: memory the layers above can
 * free on demand. The sharing layer implements it by parking idle published objects ({@code
 * --park-idle-objects}), so the pool depends on this interface and on no sharing type (as with
 * {@link HolderRequests}).
 *
 * <p>Implementations are thread-safe: misses of several threads may ask at once.
 */
@FunctionalInterface
public interface BudgetRelief {
  /**
   * Frees leased memory of a device, at least {@code bytes} when it can. Called on the thread of
   * the lease, without the pool's lock (it gives blocks back to the pool); it must not wait for
   * anything a lease in progress may hold.
   *
   * @return bytes of blocks given back to the pool; 0 when nothing could be
   */
  long relieve(int device, long bytes);
}
