package io.gpumemd.server.pool;

import io.gpumemd.server.backend.DescriptorSegment;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentDescriptor;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.PoolSnapshot.BlockKind;
import io.gpumemd.server.pool.PoolSnapshot.BlockSnapshot;
import io.gpumemd.server.pool.PoolSnapshot.Lifecycle;
import io.gpumemd.server.pool.PoolSnapshot.SegmentSnapshot;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Writes a pool down as a {@link PoolSnapshot} ({@link #take}) and rebuilds a pool from one in
 * another process ({@link #restore}), segment by segment and block by block, so that the rebuilt
 * pool is the same pool: same segment ids, blocks, idle order, holders, counters. What the
 * snapshot leaves out is recomputed: the budget's reserved bytes, the leased figures, the cached
 * bytes and the free index; {@link PoolInvariants} then checks the rebuilt pool whole.
 *
 * <p>Not refused but carried: client-cached blocks, segments awaiting unmaps (with the holders
 * still to confirm), the holders asked for their cached blocks. Refused, since they cannot be
 * written down: released blocks waiting for a completion event (a CUDA event is a handle of this
 * process), allocations in flight and frees under way (their segment is neither in nor out).
 *
 * <p>Stateless. {@link #take} takes the pool's lock, and opens descriptors after releasing it
 * (backend calls never run under it): the caller keeps requests out meanwhile (the daemon's
 * request gate), so nothing changes the pool. {@link #restore} builds a pool nobody else sees
 * yet.
 */
final class PoolSnapshots {
  private static final Logger log = LoggerFactory.getLogger(PoolSnapshots.class);
  /** Counters kept outside {@link PoolCounters}, carried in their own fields. */
  private static final Set<PoolMetric> KEPT_ELSEWHERE =
      Set.of(PoolMetric.CLIENT_CACHE_HITS, PoolMetric.CLIENT_CACHE_RETURNS, PoolMetric.SHARES);

  private PoolSnapshots() {}

  // ------------------------------------------------------------------------------------ take

  /** See {@link DevicePool#snapshot}. */
  static PoolSnapshot take(DevicePool pool, SegmentDescriptors sink) throws SnapshotRefusedException {
    int device = pool.device().ordinal();
    String backendRefusal = pool.backend.takeOverRefusal();
    if (backendRefusal != null) {
      throw new SnapshotRefusedException(backendRefusal);
    }
    List<Segment> segments = new ArrayList<>();
    Taken taken;
    pool.lock.lock();
    try {
      refuseUnsettled(pool, device);
      segments.addAll(pool.carver.live.values());
      segments.addAll(pool.holders.awaitingUnmap());
      for (Segment s : segments) {
        if (!(s.memory instanceof DescriptorSegment)) {
          throw new SnapshotRefusedException("device " + device + ": segment " + s.id + " (" + s.memory
              + ") cannot be passed as a descriptor");
        }
      }
      taken = new Taken(pool, segments);
    } finally {
      pool.lock.unlock();
    }
    // Outside the lock, like every backend call; the caller keeps the segments where they are.
    List<SegmentSnapshot> written = new ArrayList<>(segments.size());
    for (int i = 0; i < segments.size(); i++) {
      Segment s = segments.get(i);
      SegmentDescriptor descriptor;
      try {
        descriptor = ((DescriptorSegment) s.memory).open(false);
      } catch (IOException e) {
        throw new SnapshotRefusedException("device " + device + ": cannot open a descriptor of segment " + s.id
            + ": " + e.getMessage(), e);
      }
      if (descriptor == null) {
        throw new SnapshotRefusedException("device " + device + ": segment " + s.id + " was freed during the export");
      }
      written.add(taken.segment(i, sink.add(descriptor)));
    }
    return taken.snapshot(written);
  }

  /** Refuses a pool whose state cannot be written down now; with the lock held. */
  private static void refuseUnsettled(DevicePool pool, int device) throws SnapshotRefusedException {
    if (pool.closed) {
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
    private final DevicePool pool;
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
    Taken(DevicePool pool, List<Segment> segments) {
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
      retentionCapBytes = pool.eviction.retentionCapBytes();
      capSetAtRuntime = pool.eviction.capSetAtRuntime();
      peakLeasedBytes = pool.carver.peakLeasedBytes();
    }

    SegmentSnapshot segment(int i, int descriptorIndex) {
      Segment s = segments.get(i);
      return new SegmentSnapshot(s.id, s.owner, s.bytes, s.small, descriptorIndex,
          s.state == Segment.State.LIVE ? Lifecycle.LIVE : Lifecycle.AWAITING_UNMAP, blocks.get(i), mappers.get(i));
    }

    PoolSnapshot snapshot(List<SegmentSnapshot> written) {
      return new PoolSnapshot(pool.device().ordinal(), pool.device().uuid(), nextSegmentId, written, idleLru,
          counters, retentionCapBytes, capSetAtRuntime, peakLeasedBytes, pool.limitBytes(), clientCache, sharing);
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

  // --------------------------------------------------------------------------------- restore

  /**
   * Rebuilds a written-down pool in {@code pool}, which must be new (no segment yet, nothing
   * served): the daemon builds and binds everything else before it asks for the snapshot, so
   * that only this is left for the pause. On failure the pool is closed and every descriptor the
   * state names is closed or relinquished.
   */
  static void restoreInto(DevicePool pool, PoolSnapshot state, int[] descriptors) throws SnapshotRefusedException {
    DeviceInfo device = pool.device();
    MemoryBackend backend = pool.backend;
    List<SegmentSnapshot> segments = state.segments();
    Map<Integer, SegmentSnapshot> byDescriptor = new HashMap<>();
    for (SegmentSnapshot s : segments) {
      if (s.descriptorIndex() < 0 || s.descriptorIndex() >= descriptors.length || byDescriptor.put(s.descriptorIndex(), s) != null) {
        closeAll(descriptors, byDescriptor.keySet());
        throw new SnapshotRefusedException("device " + device.ordinal() + ": segment " + s.id()
            + " names descriptor " + s.descriptorIndex() + " (expected: one of its own among "
            + descriptors.length + ")");
      }
    }
    String why = check(device, backend, pool.limitBytes(), pool.publishedLimitBytes(), state);
    if (why != null) {
      closeAll(descriptors, byDescriptor.keySet());
      throw new SnapshotRefusedException("device " + device.ordinal() + ": " + why);
    }
    boolean fresh;
    pool.lock.lock();
    try {
      fresh = pool.carver.live.isEmpty() && pool.carver.nextSegmentId() == DevicePools.segmentIdBase(device.ordinal());
      if (fresh) {
        pool.carver.continueSegmentIds(state.nextSegmentId());
      }
    } finally {
      pool.lock.unlock();
    }
    if (!fresh) {
      closeAll(descriptors, byDescriptor.keySet());
      throw new SnapshotRefusedException("device " + device.ordinal() + ": the pool already has segments of its own");
    }
    List<SegmentMemory> adopted = new ArrayList<>(segments.size());
    try {
      for (SegmentSnapshot s : segments) {
        int fd = descriptors[s.descriptorIndex()];
        byDescriptor.remove(s.descriptorIndex()); // adopt owns it from here, success or not
        try {
          adopted.add(backend.adopt(device.ordinal(), fd, s.bytes()));
        } catch (RuntimeException e) {
          throw new SnapshotRefusedException("device " + device.ordinal() + ": cannot adopt segment " + s.id()
              + " (" + s.bytes() + " bytes): " + e.getMessage(), e);
        }
      }
      AfterUnlock after = new AfterUnlock(pool);
      pool.lock.lock();
      try {
        rebuild(pool, state, adopted);
        PoolInvariants.verify(pool);
        // This daemon's own cap rules from now on (unless the written-down one was set at run time).
        pool.eviction.enforceCap(after);
      } catch (AssertionError | RuntimeException e) {
        throw new SnapshotRefusedException("device " + device.ordinal() + ": the state does not make a pool: "
            + e.getMessage(), e);
      } finally {
        pool.lock.unlock();
      }
      after.run();
    } catch (SnapshotRefusedException e) {
      closeAll(descriptors, byDescriptor.keySet());
      pool.closed = true;
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
    if (DevicePools.deviceOfSegment(state.nextSegmentId()) != device.ordinal()
        || state.nextSegmentId() < DevicePools.segmentIdBase(device.ordinal())) {
      return "next segment id " + state.nextSegmentId() + " is outside the device's range";
    }
    long reserved = 0;
    for (SegmentSnapshot s : state.segments()) {
      reserved += s.bytes();
      if (s.id() < DevicePools.segmentIdBase(device.ordinal()) || s.id() >= state.nextSegmentId()) {
        return "segment id " + s.id() + " outside " + DevicePools.segmentIdBase(device.ordinal()) + ".."
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
      if (m.kind() == PoolMetric.Kind.COUNTER && !KEPT_ELSEWHERE.contains(m) && m.protoField().equals(name)) {
        return m;
      }
    }
    return null;
  }

  /** Rebuilds the rooms from the state, with the lock held; {@link PoolInvariants} checks the result. */
  private static void rebuild(DevicePool pool, PoolSnapshot state, List<SegmentMemory> adopted) {
    BlockCarver carver = pool.carver;
    Map<Long, Segment> byId = new HashMap<>();
    List<SegmentSnapshot> segments = state.segments();
    for (int i = 0; i < segments.size(); i++) {
      SegmentSnapshot s = segments.get(i);
      if (byId.containsKey(s.id())) {
        throw new IllegalArgumentException("segment " + s.id() + " twice");
      }
      Segment segment = rebuildSegment(pool, s, adopted.get(i));
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
    if (!cache.bytesByHolder().equals(pool.clientCache.byHolder())) {
      throw new IllegalArgumentException("client-cached bytes by holder " + cache.bytesByHolder()
          + " != the blocks' " + pool.clientCache.byHolder());
    }
    cache.returnAsked().forEach(pool.clientCache::restoreReturnAsked);
    pool.clientCache.reported(cache.reportedHits(), cache.reportedReturns());
    state.counters().forEach((name, value) -> pool.counters.add(counter(name), value));
    PoolSnapshot.Sharing sharing = state.sharing();
    pool.sharing.restore(sharing.shares(), sharing.liveHolds(), sharing.sharedBlocks(),
        sharing.publishedObjects(), sharing.publishedBytes());
    if (state.retentionCapSetAtRuntime()) {
      pool.eviction.restoreRuntimeCap(Math.min(state.retentionCapBytes(), pool.limitBytes()));
    }
  }

  /** One segment and its blocks, with the lock held. */
  private static Segment rebuildSegment(DevicePool pool, SegmentSnapshot s, SegmentMemory memory) {
    BlockCarver carver = pool.carver;
    if (memory.bytes() != s.bytes()) {
      throw new IllegalArgumentException("segment " + s.id() + ": adopted " + memory.bytes() + " bytes, state says "
          + s.bytes());
    }
    if (s.state() == null) {
      throw new IllegalArgumentException("segment " + s.id() + " in an unknown state");
    }
    boolean live = s.state() == Lifecycle.LIVE;
    Segment segment = carver.restoreSegment(s.id(), s.ownerKey(), memory, s.small(), live);
    pool.budget.installed(segment.bytes);
    for (String mapper : s.mappers()) {
      pool.holders.mapped(segment, mapper);
    }
    if (!live) {
      // Evicted: wholly free, out of the index, waiting for its mappers.
      if (!s.blocks().isEmpty() || s.mappers().isEmpty()) {
        throw new IllegalArgumentException("segment " + s.id() + " awaiting unmap with blocks or without holders");
      }
      carver.restoreBlock(segment, null, 0, segment.bytes, true, false);
      pool.holders.awaitUnmaps(segment);
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
        pool.clientCache.cached(prev, b.cachedBy());
      }
    }
    if (segment.head == null) {
      throw new IllegalArgumentException("live segment " + s.id() + " without blocks");
    }
    return segment;
  }

  private static void closeAll(int[] descriptors, Set<Integer> indexes) {
    for (int index : new HashSet<>(indexes)) {
      try {
        SegmentDescriptor.ofNative(descriptors[index], false).close();
      } catch (IOException | RuntimeException e) {
        log.error("Cannot close received descriptor {}: {}", descriptors[index], e.toString());
      }
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
