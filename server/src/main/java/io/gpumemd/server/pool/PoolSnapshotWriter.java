package io.gpumemd.server.pool;

import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.pool.PoolSnapshot.BlockKind;
import io.gpumemd.server.pool.PoolSnapshot.BlockSnapshot;
import io.gpumemd.server.pool.PoolSnapshot.Lifecycle;
import io.gpumemd.server.pool.PoolSnapshot.SegmentSnapshot;
import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Writes a pool down as a {@link PoolSnapshot} ({@link #take}), segment by segment and block by
 * block, for {@link PoolRestorer} to rebuild the same pool in another process.
 *
 * <p>Written down, not refused: client-cached blocks, segments awaiting unmaps (with the holders
 * still to confirm), the holders asked for their cached blocks. Refused, since they cannot be
 * written down: released blocks waiting for a completion event (a CUDA event is a handle of this
 * process), allocations in flight and frees under way (their segment is neither in nor out).
 *
 * <p>Stateless. {@link #take} takes the pool's lock, and opens descriptors after releasing it
 * (backend calls never run under it): the caller keeps requests out meanwhile (the daemon's
 * request gate), so nothing changes the pool.
 */
final class PoolSnapshotWriter {
  /** Counters kept outside {@link PoolCounters}, carried in their own fields. */
  static final Set<PoolMetric> KEPT_ELSEWHERE =
      Set.of(PoolMetric.CLIENT_CACHE_HITS, PoolMetric.CLIENT_CACHE_RETURNS, PoolMetric.SHARES);

  private PoolSnapshotWriter() {}

  /** See {@link DevicePool#restoreRefusal}. */
  static String refusalFor(PoolCore core, long otherLimitBytes) {
    String backendRefusal = core.backend.takeOverRefusal();
    if (backendRefusal != null) {
      return backendRefusal;
    }
    long held = core.locked(() -> core.budget.reservedBytes() + core.budget.inFlightBytes());
    if (held > otherLimitBytes) {
      return "device " + core.device.ordinal() + ": this daemon holds " + held + " bytes of segments and the new "
          + "one's budget is " + otherLimitBytes + " bytes (--device-limit-bytes or --device-limit-fraction); what "
          + "is leased stays leased, so give the new daemon at least " + held + " bytes";
    }
    return null;
  }

  /** See {@link DevicePool#snapshot}. */
  static PoolSnapshot take(PoolCore core, Eviction eviction, SegmentFdSink sink) throws SnapshotRefusedException {
    int device = core.device.ordinal();
    String backendRefusal = core.backend.takeOverRefusal();
    if (backendRefusal != null) {
      throw new SnapshotRefusedException(backendRefusal);
    }
    List<Segment> segments = new ArrayList<>();
    Taken taken;
    core.lock.lock();
    try {
      refuseUnsettled(core, device);
      segments.addAll(core.carver.live.values());
      segments.addAll(core.holders.awaitingUnmap());
      for (Segment s : segments) {
        if (!(s.memory instanceof FdPassedSegment)) {
          throw new SnapshotRefusedException("device " + device + ": segment " + s.id + " (" + s.memory
              + ") cannot be passed as a descriptor");
        }
      }
      taken = new Taken(core, eviction, segments);
    } finally {
      core.lock.unlock();
    }
    // Outside the lock, like every backend call; the caller keeps the segments where they are.
    List<SegmentSnapshot> written = new ArrayList<>(segments.size());
    for (int i = 0; i < segments.size(); i++) {
      Segment s = segments.get(i);
      int ahead = sink.sentAhead(s.memory);
      if (ahead >= 0) {
        written.add(taken.segment(i, ahead));
        continue;
      }
      SegmentFd descriptor;
      try {
        descriptor = ((FdPassedSegment) s.memory).open(false);
      } catch (IOException e) {
        throw new SnapshotRefusedException("device " + device + ": cannot open a descriptor of segment " + s.id
            + ": " + e.getMessage(), e);
      }
      if (descriptor == null) {
        throw new SnapshotRefusedException("device " + device + ": segment " + s.id + " was freed during the export");
      }
      written.add(taken.segment(i, sink.add(s.memory, descriptor)));
    }
    return taken.snapshot(written);
  }

  /** See {@link DevicePool#segmentsAhead}. */
  static List<SegmentAhead> ahead(PoolCore core) {
    if (core.backend.takeOverRefusal() != null) {
      return List.of();
    }
    List<Segment> segments = new ArrayList<>();
    core.lock.lock();
    try {
      if (core.closed()) {
        return List.of();
      }
      segments.addAll(core.carver.live.values());
      segments.addAll(core.holders.awaitingUnmap());
    } finally {
      core.lock.unlock();
    }
    // Outside the lock, like every backend call. The pool serves on meanwhile: a segment freed
    // since is skipped, and any that cannot be opened now go with the state (or refuse it there).
    List<SegmentAhead> ahead = new ArrayList<>(segments.size());
    for (Segment s : segments) {
      if (!(s.memory instanceof FdPassedSegment passed)) {
        continue;
      }
      try {
        SegmentFd descriptor = passed.open(false);
        if (descriptor != null) {
          ahead.add(new SegmentAhead(core.device.ordinal(), s.id, s.bytes, s.memory, descriptor));
        }
      } catch (IOException | RuntimeException e) {
        // sent with the state, or refused there
      }
    }
    return ahead;
  }

  /** Refuses a pool whose state cannot be written down now; with the lock held. */
  private static void refuseUnsettled(PoolCore pool, int device) throws SnapshotRefusedException {
    if (pool.closed()) {
      throw new SnapshotRefusedException("device " + device + ": the pool is closed");
    }
    if (pool.events.size() > 0) {
      throw new SnapshotRefusedException("device " + device + ": " + pool.events.size() + " released blocks ("
          + pool.events.bytes() + " bytes) wait for their clients' completion events"
          + (pool.events.strandedCount() > 0 ? ", " + pool.events.strandedCount() + " of them for good (their "
          + "events could not be queried)" : "") + "; try again once they have completed");
    }
    if (pool.budget.inFlightBytes() > 0 || pool.budget.freeingBytes() > 0) {
      throw new SnapshotRefusedException("device " + device + ": backend allocations (" + pool.budget.inFlightBytes()
          + " bytes) or frees (" + pool.budget.freeingBytes() + " bytes) are under way; try again");
    }
  }

  /** What {@link #take} read under the lock; the descriptors' indexes come after. */
  private static final class Taken {
    private final PoolCore pool;
    private final List<Segment> segments;
    private final List<List<BlockSnapshot>> blocks = new ArrayList<>();
    private final List<List<String>> mappers = new ArrayList<>();
    private final List<Long> idleLru = new ArrayList<>();
    private final Map<String, Long> counters = new LinkedHashMap<>();
    private final PoolSnapshot.ClientCache clientCache;
    private final PoolSnapshot.Sharing sharing;
    private final long nextSegmentId;
    private final long retentionCapBytes;
    private final boolean capSetAtRuntime;
    private final long peakLeasedBytes;

    /** Reads the pool; with the lock held. */
    Taken(PoolCore pool, Eviction eviction, List<Segment> segments) {
      this.pool = pool;
      this.segments = segments;
      for (Segment s : segments) {
        blocks.add(blocksOf(s));
        mappers.add(HolderMappings.mappersOf(s));
      }
      for (Segment s : pool.carver.idle.inOrder()) {
        idleLru.add(s.id);
      }
      for (PoolMetric m : PoolMetric.values()) {
        if (m.kind() == PoolMetric.Kind.COUNTER && !KEPT_ELSEWHERE.contains(m)) {
          counters.put(m.protoField(), pool.counters.get(m));
        }
      }
      clientCache = new PoolSnapshot.ClientCache(pool.clientCache.byHolder(), pool.clientCache.returnAsked(),
          pool.clientCache.reportedHits(), pool.clientCache.reportedReturns());
      SharingCounters s = pool.sharing;
      sharing = new PoolSnapshot.Sharing(s.shares(), s.liveHolds(), s.sharedBlocks(), s.publishedObjects(),
          s.publishedBytes());
      nextSegmentId = pool.carver.nextSegmentId();
      retentionCapBytes = eviction.retentionCapBytes();
      capSetAtRuntime = eviction.capSetAtRuntime();
      peakLeasedBytes = pool.carver.peakLeasedBytes();
    }

    SegmentSnapshot segment(int i, int descriptorIndex) {
      Segment s = segments.get(i);
      return new SegmentSnapshot(s.id, s.owner, s.bytes, s.small, descriptorIndex,
          s.state == Segment.State.LIVE ? Lifecycle.LIVE : Lifecycle.AWAITING_UNMAP, blocks.get(i), mappers.get(i));
    }

    PoolSnapshot snapshot(List<SegmentSnapshot> written) {
      return new PoolSnapshot(pool.device.ordinal(), pool.device.uuid(), nextSegmentId, written, idleLru,
          counters, retentionCapBytes, capSetAtRuntime, peakLeasedBytes, pool.budget.limitBytes(), clientCache,
          sharing);
    }

    private static List<BlockSnapshot> blocksOf(Segment s) {
      List<BlockSnapshot> out = new ArrayList<>();
      if (s.state != Segment.State.LIVE) {
        return out;
      }
      for (Block block = s.head; block != null; block = block.next) {
        out.add(switch (block.state) {
          case FREE -> new BlockSnapshot(block.offset, block.size, BlockKind.FREE, "");
          case LEASED -> new BlockSnapshot(block.offset, block.size, BlockKind.LEASED, "");
          case CLIENT_CACHED -> new BlockSnapshot(block.offset, block.size, BlockKind.CLIENT_CACHED, block.cachedBy);
          case AWAITING_EVENT -> throw new IllegalStateException("checked above: no block awaits an event");
        });
      }
      return out;
    }
  }
}
