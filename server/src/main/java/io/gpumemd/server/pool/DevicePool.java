package io.gpumemd.server.pool;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import java.util.List;
import java.util.Map;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The memory pool of one device: caches released blocks for reuse, caps what it keeps, and
 * counts hits, misses and returns. This class is the pool's public face; its lock and books are
 * held by a package-private {@link PoolCore}, and the work is done by package-private parts named
 * below that receive that core, whose class javadoc says each part.
 *
 * <h2>Algorithm</h2>
 *
 * <pre>
 *   segment (one backend allocation, e.g. 2 MiB in the small pool)
 *   +---------+------------------+-------+---------------------------------+
 *   | leased  | free (remainder) | leased| free                            |
 *   +---------+------------------+-------+---------------------------------+
 *     blocks form a list in address order; free blocks are also in a size-ordered index
 *     of the segment's owner
 * </pre>
 *
 * <ol>
 *   <li>Every lease is for an owner ({@link SegmentOwner}): blocks of different owners never
 *       share a segment, and a segment never changes owner, because a client's mapping cannot
 *       be revoked. Memory passes between owners only through a backend free and allocation.
 *   <li>A request is rounded up to 512 B ({@link SizeClasses}); up to 1 MiB it uses the small
 *       pool, above the large pool.
 *   <li><b>Hit:</b> the best-fitting free block of the owner, split when enough remains; the
 *       rest stays free ({@link BlockCarver}).
 *   <li><b>Miss:</b> a new segment for the owner within the budget, evicting idle segments and
 *       waiting for memory on its way back up to {@code unmapWaitMillis}, on the thread that
 *       asked; else {@link ExhaustedException} stating the pool ({@link Miss}, {@link Budget}).
 *   <li><b>Release:</b> the block becomes free and coalesces with free neighbours; a segment
 *       whose blocks are all free is <i>cached</i> (idle) ({@link Returns}, {@link BlockCarver}).
 *       A release that carries a completion event waits, block still in use, until the event
 *       completes ({@link PendingEvents}, {@link #pollEvents}); one whose event cannot be queried
 *       is never reused.
 *   <li><b>Eviction:</b> while cached bytes exceed the retention cap, the least recently used
 *       idle segment is freed; one that a holder may have mapped only once every such holder
 *       has confirmed an unmap or ended ({@link Eviction}, {@link HolderMappings}, {@link
 *       HolderRequests}).
 * </ol>
 *
 * <p>Byte accounting: {@code reserved = leased + client_cached + cached + remainder +
 * awaiting_event + awaiting_unmap}, where client_cached counts leased blocks their clients keep
 * closed in their own cache tier ({@link ClientCacheBooks}), cached the wholly free segments and
 * remainder the free blocks of segments that also hold leases. The retention cap bounds cached +
 * client_cached; when clients hold more, or a miss or a trim needs their memory, they are asked
 * to give blocks back. The budget bounds {@code reserved} plus allocations in flight. {@link
 * PoolInvariants} checks all of it.
 *
 * <h2>Thread-safety</h2>
 *
 * One {@link ReentrantLock} ({@link PoolCore#lock}) guards the pool's books; the critical
 * sections are index look-ups and list surgery. Backend calls (allocate, free, zero, event queries) and unmap
 * requests always run after the lock is released: work found under the lock is collected in an
 * {@link AfterUnlock} and run by the calling thread once it has unlocked; waits for memory go
 * through {@link MemoryWaiters}. Calls of the session layer that only count (a share token
 * made, a hold released, a shared block returned, a name more or less, a client's cache
 * report) take no lock ({@link SharingCounters}, {@link ClientCacheBooks#reported}); {@link
 * PoolStats} says what that means for a snapshot.
 */
public final class DevicePool implements AutoCloseable {
  /** The lock and the books; package-private for the tests. */
  final PoolCore core;
  private final Eviction eviction;
  private final Returns returns;
  private final PoolSleep sleep;

  /**
   * @param device the device this pool serves
   * @param backend where segments come from
   * @param settings budget, retention cap, oversize rule and unmap wait
   * @param holderRequests asks holders to unmap segments before they are freed
   * @param segmentIdBase first segment id; pools of different devices use disjoint ranges so
   *     that a segment id names one segment daemon-wide
   * @param ticker the clock of the unmap wait
   */
  public DevicePool(DeviceInfo device, MemoryBackend backend, PoolSettings settings,
      HolderRequests holderRequests, long segmentIdBase, Ticker ticker) {
    this.core = new PoolCore(device, backend, settings, holderRequests, segmentIdBase, ticker);
    this.eviction = new Eviction(core, settings.retentionCapBytes());
    this.returns = new Returns(core, eviction);
    this.sleep = new PoolSleep(core, eviction);
  }

  public DeviceInfo device() {
    return core.device;
  }

  public long limitBytes() {
    return core.budget.limitBytes(); // immutable: no lock needed
  }

  /**
   * The segment a miss would allocate for a request of {@code size} bytes: its size class's
   * segment rounded up to the backend's granularity (CUDA VMM: 2 MiB or more). A request whose
   * segment exceeds the budget can never be served, however much is freed.
   */
  public long segmentBytesFor(long size) {
    return Miss.segmentBytes(SizeClasses.roundUp(size), core.segmentGranularity);
  }

  /** The backend's segment granularity on this device (new segments are multiples of it). */
  public long segmentGranularity() {
    return core.segmentGranularity;
  }

  /** Most a cached block may exceed a large request and still serve it ({@link SizeClasses#largestFit}). */
  public long maxOversizeBytes() {
    return core.carver.free.maxOversizeBytes(); // immutable: no lock needed
  }

  // ------------------------------------------------------------------------------ leasing

  /**
   * Fast path: leases a cached block of the owner if one fits, without any backend call.
   *
   * @return the leased block (a hit), or {@code null} when serving it needs a backend allocation
   */
  public LeasedBlock tryLeaseCached(long requested, String holder, SegmentOwner owner) {
    long size = SizeClasses.roundUp(requested);
    core.lock.lock();
    try {
      core.checkOpen();
      Block block = core.takeCached(size, holder, owner.key());
      return block == null ? null : new LeasedBlock(block, true);
    } finally {
      core.lock.unlock();
    }
  }

  /**
   * Leases a block of at least {@code requested} bytes for a holder.
   *
   * @param requested bytes asked for; 0 &lt; requested &lt;= the budget
   * @param zero zero the block before returning it
   * @param holder the session that will map the block
   * @param owner whose memory it is: the block comes from a segment of this owner only
   * @throws ExhaustedException when the budget or the device memory is exhausted
   * @throws io.gpumemd.server.backend.BackendException when the backend fails for another reason
   */
  public LeasedBlock lease(long requested, boolean zero, String holder, SegmentOwner owner) {
    long size = SizeClasses.roundUp(requested);
    Block block;
    core.lock.lock();
    try {
      core.checkOpen();
      block = core.takeCached(size, holder, owner.key());
    } finally {
      core.lock.unlock();
    }
    LeasedBlock leased = block != null ? new LeasedBlock(block, true)
        : new Miss(core, eviction, size, holder, owner).run();
    // A block carved from a segment allocated for this very lease already reads as zeros: the
    // backend guarantees it, or the miss scrubbed the segment.
    if (zero && leased.poolHit()) {
      zeroOrRelease(leased.block());
    }
    return leased;
  }

  /** Zeroes a leased block outside the lock; on failure the block goes back before rethrowing. */
  private void zeroOrRelease(Block block) {
    try {
      core.backend.zero(block.segment.memory, block.offset, block.size);
    } catch (RuntimeException e) {
      release(block, null);
      throw e;
    }
  }

  // ----------------------------------------------------------------------------- releasing

  /**
   * Returns a leased block. With a completion event the block is reused only once the event
   * has completed; the pool owns and closes the event.
   */
  public void release(Block block, CompletionEvent event) {
    returns.release(block, event);
  }

  /**
   * Checks completion events of released blocks and returns those that completed to the cache.
   * Called periodically by the server; cheap when nothing is pending.
   */
  public void pollEvents() {
    returns.pollEvents();
  }

  // ------------------------------------------------------------------------- client cache

  /**
   * A holder closed a leased block into its own cache tier: still its lease (it counts against
   * its quota and comes back when it ends), but no longer in use. Counts against the retention
   * cap like the pool's own cache.
   *
   * @throws IllegalStateException when the block is not leased
   */
  public void clientCached(Block block, String holder) {
    returns.clientCached(block, holder);
  }

  /**
   * A holder handed a block from its cache tier out again locally.
   *
   * @throws IllegalStateException when the block is not client-cached
   */
  public void clientReused(Block block) {
    returns.clientReused(block);
  }

  /**
   * Adds what a client reports its own cache did: deltas of its cumulative counters, which the
   * session layer has validated (never negative). The pool's figures saturate at {@link
   * Long#MAX_VALUE}: clients' reports are summed, and every tenant reads the sum. Takes no lock.
   */
  public void addClientCounters(long hits, long returns) {
    core.clientCache.reported(hits, returns);
  }

  // ------------------------------------------------------------------------------ eviction

  /**
   * Sets the retention cap and evicts at once down to it.
   *
   * @param capBytes at most {@link #limitBytes()} (the caller validates)
   * @return bytes of segments evicted
   */
  public long setRetentionCap(long capBytes) {
    if (capBytes < 0 || capBytes > limitBytes()) {
      throw new IllegalArgumentException("retention cap " + capBytes + " outside 0.." + limitBytes());
    }
    return eviction.setRetentionCap(capBytes);
  }

  /**
   * Evicts cached segments, least recently used first, until at most {@code keepBytes} remain
   * cached, in the pool and in its clients' caches together: clients are asked for their cached
   * blocks, and the call waits for them (up to the unmap wait) to evict what comes back. May
   * block: call it off the transport threads.
   *
   * @return bytes of segments evicted
   */
  public long trim(long keepBytes) {
    return eviction.trim(keepBytes);
  }

  // ------------------------------------------------------------------------------ sharing

  /**
   * A leased block became shared (its first share token or name): from now on it stays leased
   * until the session layer has dropped its last hold.
   */
  public void blockShared(Block block) {
    core.sharing.blockShared(block);
  }

  /** The last hold on a shared block is gone; {@link #release} follows. Takes no lock. */
  public void sharedBlockReturned() {
    core.sharing.sharedBlockReturned();
  }

  /** A share token was made. Takes no lock. */
  public void shareMade() {
    core.sharing.shareMade();
  }

  /**
   * A holder takes a hold on a leased block of another lease: it may map the block's segment
   * from now on, so the segment is not freed before it unmaps it or ends ({@link
   * HolderMappings}).
   *
   * @throws IllegalStateException when the block is not leased (it went back meanwhile)
   */
  public void attached(Block block, String holder) {
    core.sharing.attached(block, holder);
  }

  /** A hold taken by {@link #attached} was released. Takes no lock. */
  public void holdReleased() {
    core.sharing.holdReleased();
  }

  /**
   * A shared block gets its first published name: it counts against the published-bytes limit.
   *
   * @return false, changing nothing, when it would pass the limit
   */
  public boolean publish(Block block) {
    return core.sharing.publish(block);
  }

  /**
   * A published name of a block went away; with its last name the block stops counting. Takes
   * the lock only for the last name.
   */
  public void unpublished(Block block, boolean lastName) {
    core.sharing.unpublished(block, lastName);
  }

  /** A name more for an already-published block (its bytes count once). Takes no lock. */
  public void publishedAgain() {
    core.sharing.publishedAgain();
  }

  public long publishedLimitBytes() {
    return core.sharing.publishedLimitBytes();
  }

  // ------------------------------------------------------------------------------ holders

  /** A holder confirms it has unmapped a segment the pool asked it to unmap. */
  public void unmapped(String holder, long segmentId) {
    eviction.unmapped(holder, segmentId);
  }

  /** A holder ended: it maps nothing any more. */
  public void holderEnded(String holder) {
    eviction.holderEnded(holder);
  }

  /**
   * The fd channel sent a process a descriptor of a segment: the process may map it from now on,
   * whatever becomes of the session it asked for. Called before the descriptor is opened: a
   * segment freed already is not tracked, and then no descriptor of it can be opened either.
   */
  public void descriptorSent(long segmentId, DescriptorHolder process) {
    core.locked(() -> core.holders.descriptorSent(core.segment(segmentId), process.key()));
  }

  /** A holder no longer maps one segment (a process found not to reach it): freed if evicted and it was the last. */
  public void dropped(String holder, long segmentId) {
    eviction.dropped(holder, segmentId);
  }

  /** Bytes of evicted segments that processes of the tenant may still map: see {@link HolderMappings#pinnedBytes}. */
  public long pinnedBytes(String tenant) {
    return core.locked(() -> core.holders.pinnedBytes(tenant));
  }

  /** The keys of the processes that may map segments of this pool ({@link DescriptorHolder#key}). */
  public List<String> descriptorHolders() {
    return core.locked(core.holders::descriptorHolders);
  }

  /** The segments a holder may map: id and memory, for the fd channel's reach checks. */
  public Map<Long, SegmentMemory> segmentsOf(String holder) {
    return core.locked(() -> core.holders.segmentsOf(holder));
  }

  /** Segments evicted and waiting for this holder's unmap (to ask again after a reconnect). */
  public List<Long> awaitingUnmapBy(String holder) {
    return core.locked(() -> core.holders.awaitingUnmapBy(holder));
  }

  /** Number of segments a holder may have mapped. */
  public int mappedSegments(String holder) {
    return core.locked(() -> core.holders.mappedBy(holder));
  }

  /** The pool's part of sleep and wake (Allocator.Sleep and Wake). */
  public PoolSleep sleep() {
    return sleep;
  }

  // ----------------------------------------------------------------------- snapshot, restore

  /** The blocks of a live segment by offset (none when not live): how a restore finds its leases' blocks. */
  public Map<Long, Block> blocksOf(long segmentId) {
    return core.locked(() -> core.carver.blocksOf(segmentId));
  }

  /**
   * Why a pool with budget {@code otherLimitBytes} for this device could not be restored from
   * this one's snapshot, or null: checked before anything moves (a snapshot is never shrunk to
   * fit, so the other budget must cover every segment the pool holds). Conditions that pass with
   * time (events, allocations in flight) are {@link #snapshot}'s to refuse.
   */
  public String restoreRefusal(long otherLimitBytes) {
    return PoolSnapshotWriter.refusalFor(core, otherLimitBytes);
  }

  /**
   * Writes this pool down ({@link PoolSnapshot}, {@link PoolSnapshotWriter}), with a read-write
   * descriptor of every segment it holds (live, or evicted and awaiting unmaps) put in {@code
   * sink}. Changes nothing: the pool serves on if nothing comes of it, and {@link #relinquish} ends
   * it once another process serves it. Call it while no request is applied, so that nothing
   * changes between the snapshot and the descriptors (opened after the lock is released).
   *
   * @throws SnapshotRefusedException when the pool cannot be written down now: the backend cannot
   *     pass segments on ({@link MemoryBackend#takeOverRefusal}), released blocks wait for
   *     completion events, allocations or frees are under way, a segment has no descriptor, or
   *     the pool is closed; descriptors already in the sink stay the sink's
   */
  public PoolSnapshot snapshot(SegmentFdSink sink) throws SnapshotRefusedException {
    return PoolSnapshotWriter.take(core, eviction, sink);
  }

  /**
   * A new descriptor of each segment, with what the export will know it by, for a take-over to
   * send ahead of the state while the pool serves on: the successor adopts them meanwhile, and
   * the pause holds only the segments made since. Segments that cannot be passed are left out
   * (the export refuses them); the caller sends and closes the descriptors.
   */
  public List<SegmentAhead> segmentsAhead() {
    return PoolSnapshotWriter.ahead(core);
  }

  /**
   * Rebuilds in this new pool (no segment yet, nothing served) a pool written down in another
   * process ({@link PoolRestorer}): every segment adopted from its descriptor ({@link
   * MemoryBackend#adopt}), with the same ids, blocks, idle order, holders, client-cached blocks,
   * counters and sharing figures, under this daemon's settings, never shrunk to fit.
   *
   * @param segments what the snapshot names by index; every one it names is this call's from now
   *     on (taken, or given up on failure), the others stay {@code segments}'s
   * @throws SnapshotRefusedException when the snapshot does not fit this daemon or does not make
   *     a pool; the pool is then closed, every segment adopted so far relinquished (never freed)
   */
  public void restore(PoolSnapshot snapshot, IncomingSegments segments) throws SnapshotRefusedException {
    PoolRestorer.restoreInto(core, eviction, snapshot, segments);
  }

  /**
   * Ends the pool once another process serves it (restored from its {@link #snapshot}): as
   * {@link #close}, but every segment is relinquished ({@link MemoryBackend#relinquish}: this
   * process's references dropped, the memory kept for the other), never freed. Idempotent;
   * afterwards the pool refuses everything as a closed one does, and releases only settle its
   * books.
   */
  public void relinquish() {
    end(false);
  }

  // ------------------------------------------------------------------------------ reporting

  /** The pool's figures, taken under the lock; see {@link PoolStats} for which are exact. */
  public PoolStats stats() {
    return core.locked(() -> PoolStats.snapshot(core, eviction.retentionCapBytes()));
  }

  /**
   * Checks the pool's structure; for tests. Throws {@link AssertionError} describing the first
   * violation (see {@link PoolInvariants}).
   */
  public void verifyInvariants() {
    core.locked(() -> {
      PoolInvariants.verify(core);
      return null;
    });
  }

  /**
   * Frees every segment, leased or not, mapped or not: the daemon is exiting. Idempotent.
   */
  @Override
  public void close() {
    end(true);
  }

  /** Closes the pool once: each segment is freed, or relinquished to another process. */
  private void end(boolean free) {
    List<Segment> all;
    List<PendingEvents.Pending> pending;
    core.lock.lock();
    try {
      if (core.closed()) {
        return;
      }
      core.markClosed();
      all = eviction.giveUpAll(free);
      pending = core.events.drain();
      core.waiters.closed();
    } finally {
      core.lock.unlock();
    }
    pending.forEach(p -> p.event().close());
    for (Segment s : all) {
      if (free) {
        core.backend.free(s.memory);
      } else {
        PoolRestorer.relinquishQuietly(core.backend, s.memory);
      }
    }
  }
}
