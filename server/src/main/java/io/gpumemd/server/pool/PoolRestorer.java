package io.gpumemd.server.pool;

import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.PoolSnapshot.BlockKind;
import io.gpumemd.server.pool.PoolSnapshot.BlockSnapshot;
import io.gpumemd.server.pool.PoolSnapshot.Lifecycle;
import io.gpumemd.server.pool.PoolSnapshot.SegmentSnapshot;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Rebuilds a pool written down by {@link PoolSnapshotWriter} in another process ({@link
 * #restoreInto}), segment by segment and block by block, so that the rebuilt pool is the same
 * pool: same segment ids, blocks, idle order, holders, counters. What the snapshot leaves out is
 * recomputed: the budget's reserved bytes, the leased figures, the cached bytes and the free
 * index; {@link PoolInvariants} then checks the rebuilt pool whole. The configuration of this
 * daemon rules (budget, published limit, retention cap unless set at run time), but the snapshot
 * is never shrunk to fit.
 *
 * <p>Stateless; builds a pool nobody else sees yet.
 */
final class PoolRestorer {
  private static final Logger log = LoggerFactory.getLogger(PoolRestorer.class);

  private PoolRestorer() {}

  /**
   * Rebuilds a written-down pool in {@code core} (with its {@code eviction}), which must be new
   * (no segment yet, nothing served): the daemon builds and binds everything else before it asks for the snapshot, so
   * that only this is left for the pause. On failure the pool is closed and every descriptor the
   * state names is closed or relinquished.
   */
  static void restoreInto(PoolCore core, Eviction eviction, PoolSnapshot state, IncomingSegments incoming)
      throws SnapshotRefusedException {
    DeviceInfo device = core.device;
    MemoryBackend backend = core.backend;
    List<SegmentSnapshot> segments = state.segments();
    Map<Integer, SegmentSnapshot> byDescriptor = new HashMap<>();
    for (SegmentSnapshot s : segments) {
      int index = s.descriptorIndex();
      if (!incoming.available(index) || byDescriptor.put(index, s) != null) {
        discardAll(incoming, byDescriptor.keySet());
        throw new SnapshotRefusedException("device " + device.ordinal() + ": segment " + s.id()
            + " names descriptor " + s.descriptorIndex() + " (expected: one of its own among "
            + incoming.size() + ")");
      }
    }
    String why = check(device, backend, core.budget.limitBytes(), core.sharing.publishedLimitBytes(), state);
    if (why != null) {
      discardAll(incoming, byDescriptor.keySet());
      throw new SnapshotRefusedException("device " + device.ordinal() + ": " + why);
    }
    boolean fresh;
    core.lock.lock();
    try {
      fresh = core.carver.live.isEmpty() && core.carver.nextSegmentId() == SegmentIds.base(device.ordinal());
      if (fresh) {
        core.carver.continueSegmentIds(state.nextSegmentId());
      }
    } finally {
      core.lock.unlock();
    }
    if (!fresh) {
      discardAll(incoming, byDescriptor.keySet());
      throw new SnapshotRefusedException("device " + device.ordinal() + ": the pool already has segments of its own");
    }
    List<SegmentMemory> adopted = new ArrayList<>(segments.size());
    try {
      for (SegmentSnapshot s : segments) {
        byDescriptor.remove(s.descriptorIndex()); // taken from here, success or not
        try {
          adopted.add(incoming.take(s.descriptorIndex(), device.ordinal(), s.bytes()));
        } catch (RuntimeException e) {
          throw new SnapshotRefusedException("device " + device.ordinal() + ": cannot adopt segment " + s.id()
              + " (" + s.bytes() + " bytes): " + e.getMessage(), e);
        }
      }
      AfterUnlock after = new AfterUnlock(core);
      core.lock.lock();
      try {
        rebuild(core, state, adopted);
        if (state.retentionCapSetAtRuntime()) {
          eviction.restoreRuntimeCap(Math.min(state.retentionCapBytes(), core.budget.limitBytes()));
        }
        PoolInvariants.verify(core);
        // This daemon's own cap rules from now on (unless the written-down one was set at run time).
        eviction.enforceCap(after);
      } catch (AssertionError | RuntimeException e) {
        throw new SnapshotRefusedException("device " + device.ordinal() + ": the state does not make a pool: "
            + e.getMessage(), e);
      } finally {
        core.lock.unlock();
      }
      after.run();
    } catch (SnapshotRefusedException e) {
      discardAll(incoming, byDescriptor.keySet());
      core.markClosed();
      for (SegmentMemory memory : adopted) {
        relinquishQuietly(backend, memory);
      }
      throw e;
    }
  }

  /** What this daemon's configuration cannot take, or null. The snapshot is never shrunk to fit. */
  private static String check(DeviceInfo device, MemoryBackend backend, long limitBytes, long publishedLimitBytes,
      PoolSnapshot state) {
    String refusal = backend.takeOverRefusal();
    if (refusal != null) {
      return refusal;
    }
    if (state.device() != device.ordinal()) {
      return "the state is of device " + state.device();
    }
    // The daemon written down checked this one's UUIDs too; this side checks what it was given.
    if (backend.devicesMatchByUuid() && !device.uuid().equalsIgnoreCase(state.deviceUuid())) {
      return "the running daemon's device " + state.device() + " is "
          + (state.deviceUuid().isEmpty() ? "unnamed (no UUID in its state)" : state.deviceUuid())
          + " and this daemon's device " + device.ordinal() + " is " + device.uuid() + ": a successor must see the "
          + "same GPUs in the same order (start it with the running daemon's CUDA_VISIBLE_DEVICES)";
    }
    if (SegmentIds.deviceOf(state.nextSegmentId()) != device.ordinal()
        || state.nextSegmentId() < SegmentIds.base(device.ordinal())) {
      return "next segment id " + state.nextSegmentId() + " is outside the device's range";
    }
    long reserved = 0;
    for (SegmentSnapshot s : state.segments()) {
      reserved += s.bytes();
      if (s.id() < SegmentIds.base(device.ordinal()) || s.id() >= state.nextSegmentId()) {
        return "segment id " + s.id() + " outside " + SegmentIds.base(device.ordinal()) + ".."
            + (state.nextSegmentId() - 1);
      }
    }
    if (reserved > limitBytes) {
      return "the pool holds " + reserved + " bytes of segments, over this daemon's budget of " + limitBytes
          + " bytes (--device-limit-bytes or --device-limit-fraction); what is leased stays leased, so give the new "
          + "daemon at least that budget";
    }
    if (state.sharing().publishedBytes() > publishedLimitBytes) {
      return "published objects hold " + state.sharing().publishedBytes() + " bytes, over this daemon's "
          + "published-bytes limit of " + publishedLimitBytes;
    }
    for (String name : state.counters().keySet()) {
      if (counter(name) == null) {
        return "unknown counter '" + name + "' (a newer daemon's state?)";
      }
    }
    return null;
  }

  private static PoolMetric counter(String name) {
    for (PoolMetric m : PoolMetric.values()) {
      if (m.kind() == PoolMetric.Kind.COUNTER && !PoolSnapshotWriter.KEPT_ELSEWHERE.contains(m)
          && m.protoField().equals(name)) {
        return m;
      }
    }
    return null;
  }

  /** Rebuilds the rooms from the state, with the lock held; {@link PoolInvariants} checks the result. */
  private static void rebuild(PoolCore core, PoolSnapshot state, List<SegmentMemory> adopted) {
    BlockCarver carver = core.carver;
    Map<Long, Segment> byId = new HashMap<>();
    List<SegmentSnapshot> segments = state.segments();
    for (int i = 0; i < segments.size(); i++) {
      SegmentSnapshot s = segments.get(i);
      if (byId.containsKey(s.id())) {
        throw new IllegalArgumentException("segment " + s.id() + " twice");
      }
      Segment segment = rebuildSegment(core, s, adopted.get(i));
      byId.put(segment.id, segment);
    }
    for (long id : state.idleLru()) {
      Segment segment = byId.get(id);
      if (segment == null || segment.state != Segment.State.LIVE || !segment.idle()) {
        throw new IllegalArgumentException("idle segment " + id + " is not a live, wholly free segment");
      }
      carver.restoreIdle(segment);
    }
    carver.restorePeak(state.peakLeasedBytes());
    PoolSnapshot.ClientCache cache = state.clientCache();
    if (!cache.bytesByHolder().equals(core.clientCache.byHolder())) {
      throw new IllegalArgumentException("client-cached bytes by holder " + cache.bytesByHolder()
          + " != the blocks' " + core.clientCache.byHolder());
    }
    cache.returnAsked().forEach(core.clientCache::restoreReturnAsked);
    core.clientCache.reported(cache.reportedHits(), cache.reportedReturns());
    state.counters().forEach((name, value) -> core.counters.add(counter(name), value));
    PoolSnapshot.Sharing sharing = state.sharing();
    core.sharing.restore(sharing.shares(), sharing.liveHolds(), sharing.sharedBlocks(),
        sharing.publishedObjects(), sharing.publishedBytes());
  }

  /** One segment and its blocks, with the lock held. */
  private static Segment rebuildSegment(PoolCore core, SegmentSnapshot s, SegmentMemory memory) {
    BlockCarver carver = core.carver;
    if (memory.bytes() != s.bytes()) {
      throw new IllegalArgumentException("segment " + s.id() + ": adopted " + memory.bytes() + " bytes, state says "
          + s.bytes());
    }
    if (s.state() == null) {
      throw new IllegalArgumentException("segment " + s.id() + " in an unknown state");
    }
    boolean live = s.state() == Lifecycle.LIVE;
    Segment segment = carver.restoreSegment(s.id(), s.ownerKey(), memory, s.small(), live);
    core.budget.installed(segment.bytes);
    for (String mapper : s.mappers()) {
      core.holders.mapped(segment, mapper);
    }
    if (!live) {
      // Evicted: wholly free, out of the index, waiting for its mappers.
      if (!s.blocks().isEmpty() || s.mappers().isEmpty()) {
        throw new IllegalArgumentException("segment " + s.id() + " awaiting unmap with blocks or without holders");
      }
      carver.restoreBlock(segment, null, 0, segment.bytes, true, false);
      core.holders.awaitUnmaps(segment);
      return segment;
    }
    Block prev = null;
    for (BlockSnapshot b : s.blocks()) {
      if (b.state() == null) {
        throw new IllegalArgumentException("block at " + b.offset() + " of segment " + s.id() + " in an unknown state");
      }
      if ((b.state() == BlockKind.CLIENT_CACHED) == b.cachedBy().isEmpty()) {
        throw new IllegalArgumentException("block at " + b.offset() + " of segment " + s.id() + " in state "
            + b.state() + " cached by '" + b.cachedBy() + "'");
      }
      prev = carver.restoreBlock(segment, prev, b.offset(), b.size(), b.state() == BlockKind.FREE, true);
      if (b.state() == BlockKind.CLIENT_CACHED) {
        core.clientCache.cached(prev, b.cachedBy());
      }
    }
    if (segment.head == null) {
      throw new IllegalArgumentException("live segment " + s.id() + " without blocks");
    }
    return segment;
  }

  private static void discardAll(IncomingSegments incoming, Set<Integer> indexes) {
    for (int index : indexes) {
      incoming.discard(index);
    }
    indexes.clear();
  }

  static void relinquishQuietly(MemoryBackend backend, SegmentMemory memory) {
    try {
      backend.relinquish(memory);
    } catch (RuntimeException e) {
      log.error("Cannot drop this daemon's references to {}: {}", memory, e.toString());
    }
  }
}
