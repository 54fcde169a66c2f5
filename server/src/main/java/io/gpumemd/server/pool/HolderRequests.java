package io.gpumemd.server.pool;

/**
 * Asks a holder (a session) to unmap a segment that the pool wants to free (rule 2: a segment
 * is freed only once no live client has it mapped). The holder answers later through
 * {@link DevicePool#unmapped} or, if it ends first, {@link DevicePool#holderEnded}.
 *
 * <p>Called outside the pool lock; implementations must not block.
 */
@FunctionalInterface
public interface UnmapRequester {
  void requestUnmap(String holder, int device, long segmentId);
}
