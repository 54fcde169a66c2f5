package io.gpumemd.server.pool;

import io.gpumemd.server.backend.CompletionEvent;
import java.util.List;

/**
 * How leased blocks stop being in use in one pool: a release (at once, or once its completion
 * event has completed, {@link PendingEvents}), and a client keeping a block in its own cache
 * tier and handing it out again ({@link ClientCacheBooks}). A block that is no longer used goes
 * back to the cache ({@link BlockCarver#giveBack}), and the retention cap applies ({@link
 * Eviction#enforceCap}).
 *
 * <p>It works on the pool's {@link PoolCore} and holds no state of its own. Thread-safety: each
 * method takes the core's lock, and runs the backend calls and holder requests it found under it
 * once unlocked ({@link AfterUnlock}); event queries run outside it too.
 */
final class Returns {
  private final PoolCore core;
  private final Eviction eviction;

  Returns(PoolCore core, Eviction eviction) {
    this.core = core;
    this.eviction = eviction;
  }

  /** See {@link DevicePool#release}. */
  void release(Block block, CompletionEvent event) {
    AfterUnlock after = new AfterUnlock(core);
    core.lock.lock();
    try {
      if (block.state == Block.State.CLIENT_CACHED) {
        core.clientCache.uncached(block);
        core.waiters.memoryCameBack();
      } else if (block.state == Block.State.LEASED) {
        core.carver.unleased(block);
      } else {
        throw new IllegalStateException("release of a block that is not leased: " + block);
      }
      if (event != null && !core.closed()) {
        core.events.add(block, event);
        event = null; // now owned by the pending events
        return;
      }
      returnToCache(block, after);
    } finally {
      core.lock.unlock();
      after.run();
      if (event != null) {
        // Closed pool: nothing will wait for the event, but we own it.
        event.close();
      }
    }
  }

  /** Puts a no-longer-used block back: coalesce, index, cache the segment if idle, apply the cap. */
  private void returnToCache(Block block, AfterUnlock after) {
    if (core.carver.giveBack(block)) {
      eviction.enforceCap(after);
    }
    // A block whose segment the cap evicted at once went back to the backend, not the cache:
    // that is an eviction, not a return. So is one of a pool closed under it.
    if (block.segment.state == Segment.State.LIVE) {
      core.counters.increment(PoolMetric.RETURNS);
    }
  }

  /** See {@link DevicePool#pollEvents}. */
  void pollEvents() {
    List<PendingEvents.Pending> pending;
    core.lock.lock();
    try {
      if (core.events.isEmpty()) {
        return;
      }
      pending = core.events.snapshot();
    } finally {
      core.lock.unlock();
    }
    PendingEvents.Outcome outcome = PendingEvents.query(pending);
    if (outcome.isEmpty()) {
      return;
    }
    AfterUnlock after = new AfterUnlock(core);
    core.lock.lock();
    try {
      for (Block block : core.events.removeCompleted(outcome.done())) {
        if (block.state == Block.State.AWAITING_EVENT) {
          returnToCache(block, after);
        }
      }
      core.events.strand(outcome.failed(), core.device.ordinal());
    } finally {
      core.lock.unlock();
      after.run();
    }
    outcome.done().forEach(p -> p.event().close());
    outcome.failed().forEach(f -> f.pending().event().close());
  }

  /** See {@link DevicePool#clientCached}. */
  void clientCached(Block block, String holder) {
    AfterUnlock after = new AfterUnlock(core);
    core.lock.lock();
    try {
      core.clientCache.cached(block, holder);
      eviction.enforceCap(after);
    } finally {
      core.lock.unlock();
      after.run();
    }
  }

  /** See {@link DevicePool#clientReused}. */
  void clientReused(Block block) {
    core.lock.lock();
    try {
      core.clientCache.reused(block);
      core.waiters.memoryCameBack();
    } finally {
      core.lock.unlock();
    }
  }
}
