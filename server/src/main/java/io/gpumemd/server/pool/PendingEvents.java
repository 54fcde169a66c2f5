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
 * <p>Guarded by the owning {@link DevicePool}'s lock; the events themselves are queried
 * outside it ({@link #completed}).
 */
final class PendingEvents {
  private static final Logger log = LoggerFactory.getLogger(PendingEvents.class);

  /** A released block and the event it waits for. */
  record Pending(Block block, CompletionEvent event) {}

  private final List<Pending> pending = new ArrayList<>();
  private long bytes;

  void add(Block block, CompletionEvent event) {
    pending.add(new Pending(block, event));
    bytes += block.size;
  }

  /** A copy to query outside the lock. */
  List<Pending> snapshot() {
    return new ArrayList<>(pending);
  }

  /**
   * Queries the events of a {@link #snapshot}, outside the lock: a query that fails counts as
   * complete (logged), since nothing else would ever release the block.
   *
   * @return the entries whose event completed
   */
  static List<Pending> completed(List<Pending> pending, int device) {
    List<Pending> done = new ArrayList<>();
    for (Pending p : pending) {
      boolean complete;
      try {
        complete = p.event().isComplete();
      } catch (RuntimeException e) {
        log.warn("device {}: completion event query failed, treating it as complete: {}", device, e.toString());
        complete = true;
      }
      if (complete) {
        done.add(p);
      }
    }
    return done;
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

  /** Removes and returns every entry: the pool is closing. */
  List<Pending> drain() {
    List<Pending> all = new ArrayList<>(pending);
    pending.clear();
    bytes = 0;
    return all;
  }

  boolean isEmpty() {
    return pending.isEmpty();
  }

  int size() {
    return pending.size();
  }

  long bytes() {
    return bytes;
  }

  /** Fills in the figures this class keeps. */
  void report(long[] v) {
    v[PoolMetric.AWAITING_EVENT_BYTES.ordinal()] = bytes;
    v[PoolMetric.BLOCKS_AWAITING_EVENT.ordinal()] = pending.size();
  }
}
