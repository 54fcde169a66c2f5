package io.gpumemd.server.pool;

import io.gpumemd.server.backend.CompletionEvent;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Released blocks that carry a completion event (a CUDA IPC event the client recorded after
 * its last use) and stay out of the cache until the event completes (rule 3 of the README's
 * "The rules that keep memory safe").
 * The pool owns each event from the release on and closes it once it is done with it.
 *
 * <p>An event whose query fails (a CUDA error, not "not ready") says nothing about the client's
 * kernels: they may still be writing the block. Such a block is <i>stranded</i>: never queried
 * again, never reused, its event closed, its bytes still counted as awaiting an event (so the
 * budget, not the cache, pays for it) until the pool closes; a WARN names it once. Its segment
 * is never wholly free, so it is never evicted either. The cost is bounded by the bytes
 * released with such events, and no block is ever handed out while a kernel may use it.
 *
 * <p>Guarded by the owning pool's lock ({@link PoolCore#lock}); the events themselves are queried
 * outside it ({@link #completed}).
 */
final class PendingEvents {
  private static final Logger log = LoggerFactory.getLogger(PendingEvents.class);

  /** A released block and the event it waits for. */
  record Pending(Block block, CompletionEvent event) {}

  /** An entry whose event query failed, and how. */
  record Failed(Pending pending, RuntimeException failure) {}

  /** What one round of queries found: events that completed, and queries that failed. */
  record Outcome(List<Pending> done, List<Failed> failed) {
    boolean isEmpty() {
      return done.isEmpty() && failed.isEmpty();
    }
  }

  private final List<Pending> pending = new ArrayList<>();
  /** Blocks whose event query failed: kept out of the cache for good (see the class comment). */
  private final List<Block> stranded = new ArrayList<>();
  /** Bytes of {@link #pending} and {@link #stranded} together. */
  private long bytes;

  /** A released block waits for its event: it is in neither the leases nor the cache meanwhile. */
  void add(Block block, CompletionEvent event) {
    block.state = Block.State.AWAITING_EVENT;
    pending.add(new Pending(block, event));
    bytes += block.size;
  }

  /** A copy to query outside the lock. */
  List<Pending> snapshot() {
    return new ArrayList<>(pending);
  }

  /**
   * Queries the events of a {@link #snapshot}, outside the lock. A query that throws is a
   * failure, never a completion: the block may still be in use on the device.
   */
  static Outcome query(List<Pending> pending) {
    List<Pending> done = new ArrayList<>();
    List<Failed> failed = new ArrayList<>();
    for (Pending p : pending) {
      try {
        if (p.event().isComplete()) {
          done.add(p);
        }
      } catch (RuntimeException e) {
        failed.add(new Failed(p, e));
      }
    }
    return new Outcome(done, failed);
  }

  /**
   * Moves entries whose query failed to the stranded blocks (their bytes stay counted), one
   * WARN each; the caller closes their events.
   */
  void strand(List<Failed> failed, int device) {
    if (failed.isEmpty()) {
      return;
    }
    Set<Pending> gone = new HashSet<>();
    for (Failed f : failed) {
      gone.add(f.pending());
      Block block = f.pending().block();
      stranded.add(block);
      log.warn("device {}: the completion event of a released {}-byte block (segment {}) cannot be queried ({}); "
          + "the client's work on it may still run, so the block is never reused and stays counted until the "
          + "daemon stops", device, block.size, block.segment.id, f.failure().getMessage());
    }
    pending.removeIf(gone::contains);
  }

  /**
   * Removes completed entries in one pass (one by one would be quadratic when thousands of
   * events are pending).
   *
   * @return their blocks, to go back to the cache
   */
  List<Block> removeCompleted(List<Pending> completed) {
    Set<Pending> done = new HashSet<>(completed);
    List<Block> blocks = new ArrayList<>(completed.size());
    pending.removeIf(p -> {
      if (!done.contains(p)) {
        return false;
      }
      bytes -= p.block.size;
      blocks.add(p.block);
      return true;
    });
    return blocks;
  }

  /** Removes and returns every entry still waiting (stranded ones included as gone): the pool is closing. */
  List<Pending> drain() {
    List<Pending> all = new ArrayList<>(pending);
    pending.clear();
    stranded.clear();
    bytes = 0;
    return all;
  }

  /** True when no event is left to query (stranded blocks have none). */
  boolean isEmpty() {
    return pending.isEmpty();
  }

  /** Blocks awaiting an event, stranded ones included. */
  int size() {
    return pending.size() + stranded.size();
  }

  /** Blocks whose event query failed. */
  int strandedCount() {
    return stranded.size();
  }

  long bytes() {
    return bytes;
  }

  /** Fills in the figures this class keeps. */
  void report(long[] v) {
    v[PoolMetric.AWAITING_EVENT_BYTES.ordinal()] = bytes;
    v[PoolMetric.BLOCKS_AWAITING_EVENT.ordinal()] = size();
  }
}
