package io.gpumemd.server.pool;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Work a pool finds under its lock that must run after the lock is released: backend frees
 * (which may take milliseconds) and requests to holders (unmap a segment, give back cached
 * blocks), which call into the session layer. One
 * per pool operation, owned by the thread running it.
 */
final class AfterUnlock {
  private static final Logger log = LoggerFactory.getLogger(AfterUnlock.class);

  /** Asks {@code holder} to unmap a segment. */
  private record UnmapAsk(String holder, long segmentId) {}

  /** Asks {@code holder} to give back client-cached bytes (0 = all), or reports it overdue. */
  private record ReturnAsk(String holder, long bytes, boolean overdue) {}

  /** The one reference to the pool's collaborators: one of these is made per release. */
  private final PoolCore core;
  private List<Segment> toFree;
  private List<UnmapAsk> unmaps;
  private List<ReturnAsk> returns;

  AfterUnlock(PoolCore core) {
    this.core = core;
  }

  /**
   * Runs {@code work} under the pool's lock, then, once unlocked, the work it left here. For
   * the pool's cold paths; the hot ones spell it out and spare the lambda.
   */
  static <T> T locked(PoolCore core, Function<AfterUnlock, T> work) {
    AfterUnlock after = new AfterUnlock(core);
    core.lock.lock();
    try {
      return work.apply(after);
    } finally {
      core.lock.unlock();
      after.run();
    }
  }

  void free(Segment segment) {
    if (toFree == null) {
      toFree = new ArrayList<>(2);
    }
    toFree.add(segment);
  }

  void askUnmap(String holder, long segmentId) {
    if (unmaps == null) {
      unmaps = new ArrayList<>(2);
    }
    unmaps.add(new UnmapAsk(holder, segmentId));
  }

  void askCacheReturn(String holder, long bytes) {
    if (returns == null) {
      returns = new ArrayList<>(2);
    }
    returns.add(new ReturnAsk(holder, bytes, false));
  }

  void cacheReturnOverdue(String holder) {
    if (returns == null) {
      returns = new ArrayList<>(2);
    }
    returns.add(new ReturnAsk(holder, 0, true));
  }

  /** Runs the collected work; call with the pool lock released. */
  void run() {
    int device = core.device.ordinal();
    if (toFree != null) {
      for (Segment segment : toFree) {
        try {
          core.backend.free(segment.memory);
        } finally {
          core.segmentFreed(segment);
        }
        log.debug("device {}: freed segment {} ({} bytes)", device, segment.id, segment.bytes);
      }
    }
    if (unmaps != null) {
      for (UnmapAsk ask : unmaps) {
        core.holderRequests.requestUnmap(ask.holder(), device, ask.segmentId());
      }
    }
    if (returns != null) {
      for (ReturnAsk ask : returns) {
        if (ask.overdue()) {
          core.holderRequests.cacheReturnOverdue(ask.holder());
        } else {
          log.debug("device {}: asking {} to give back {} client-cached bytes", device, ask.holder(),
              ask.bytes() == 0 ? "all its" : ask.bytes());
          core.holderRequests.requestCacheReturn(ask.holder(), device, ask.bytes());
        }
      }
    }
  }
}
