package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import java.util.Collection;
import java.util.List;

/**
 * One pool's part of sleep and wake (Allocator.Sleep and Wake; the design is in {@code
 * offload/package-info.java}): freeing a sleeping holder's blocks and the segments it vacated,
 * and new segments with its blocks at their old offsets; likewise a parked object's block, and
 * the {@link BudgetRelief} a miss asks ({@code --park-idle-objects}). The session layer keeps which leases
 * sleep and their contents; this class keeps nothing.
 *
 * <p>Thread-safe: each call takes the pool's lock for its bookkeeping and makes its backend
 * calls outside it, as a miss and an eviction do.
 */
public final class PoolSleep {
  private final PoolCore core;
  private final Eviction eviction;

  PoolSleep(PoolCore core, Eviction eviction) {
    this.core = core;
    this.eviction = eviction;
  }

  /**
   * A holder's leased blocks go to sleep: each is freed to the pool, and each vacated segment
   * (the holder's mapping of it is gone) is given back to the backend at once when that left it
   * unused and unmapped, else once its other mappers have unmapped it. The caller has copied out
   * what it keeps.
   *
   * @param vacatedSegmentIds segments of these blocks the holder no longer maps
   * @return where each block was (copies that no pool book links), in order
   * @throws IllegalStateException when a block is not leased; nothing changed then
   */
  public List<Block> sleep(List<Block> blocks, String holder, Collection<Long> vacatedSegmentIds) {
    return eviction.sleep(blocks, holder, vacatedSegmentIds);
  }

  /**
   * Wakes sleeping blocks of one old segment: a new segment of {@code segmentBytes} for the
   * owner, within the budget as a miss is (it evicts, waits and refuses alike), with each range
   * leased at its old offset and the gaps free. Reads as zeros.
   *
   * @param small whether the old segment served small requests
   * @param ranges offset and size pairs, ordered by offset
   * @return the leased blocks, in the order of the ranges
   * @throws ExhaustedException when the memory cannot be had
   */
  public List<Block> wake(long segmentBytes, boolean small, long[] ranges, String holder, SegmentOwner owner) {
    return List.of(Miss.wake(core, eviction, segmentBytes, small, ranges, holder, owner));
  }

  /**
   * A parked object's block goes back (its contents are in the host store): freed as {@link
   * #sleep} frees one block, its segment given back to the backend when left unused and unmapped.
   *
   * @return where the block was (a copy that no pool book links)
   * @throws IllegalStateException when the block is not leased; nothing changed then
   */
  public Block park(Block block) {
    return eviction.park(block);
  }

  /**
   * A published block goes to sleep with its lease ({@code names} > 0 names): see {@link
   * SharingCounters#publishedAsleep}. Before {@link #sleep} frees it.
   */
  public void publishedAsleep(Block block, int names) {
    core.sharing.publishedAsleep(block, names);
  }

  /** A name of a sleeping published block of {@code bytes} went away ({@code lastName}: its last). */
  public void unpublishedAsleep(long bytes, boolean lastName) {
    core.sharing.unpublishedAsleep(bytes, lastName);
  }

  /** A sleeping published block with {@code names} names woke into {@code fresh} (leased). */
  public void publishedAwake(Block fresh, int names) {
    core.sharing.publishedAwake(fresh, names);
  }

  /**
   * How long a sleep waits for the other holders of its shared blocks to release them ({@code
   * --unmap-wait-ms}, the bound on every wait for other clients' mappings).
   */
  public long unmapWaitNanos() {
    return core.unmapWaitNanos;
  }

  /** What a miss asks before it refuses a lease for lack of budget ({@link Miss}); null for nothing. */
  public void budgetRelief(BudgetRelief relief) {
    core.relief = relief;
  }
}
