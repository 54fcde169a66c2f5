package io.gpumemd.server.pool;

/**
 * What a pool asks of the holders (sessions) of its memory, over their KeepAlive streams:
 * unmap a segment it wants to free (the README's rule 2: a segment is freed only once no live
 * client has it mapped), or give back blocks the client keeps in its own cache tier because the pool needs
 * the memory. The holder answers later through {@link DevicePool#unmapped} or by releasing the
 * blocks, or, if it ends first, through {@link DevicePool#holderEnded}.
 *
 * <p>Called outside the pool lock; implementations must not block.
 */
public interface HolderRequests {
  /** Asks a holder to unmap a segment and confirm. */
  void requestUnmap(String holder, int device, long segmentId);

  /** Asks a holder to release client-cached blocks on a device: at least {@code bytes}, all if 0. */
  void requestCacheReturn(String holder, int device, long bytes);

  /**
   * A holder did not give back client-cached memory the pool waited for: it should not be
   * trusted with a client cache allowance until it does.
   */
  void cacheReturnOverdue(String holder);
}
