package io.gpumemd.server.pool;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.takeover.v1.BlockState;
import io.gpumemd.proto.takeover.v1.ClientCacheState;
import io.gpumemd.proto.takeover.v1.PoolState;
import io.gpumemd.proto.takeover.v1.SegmentState;
import io.gpumemd.proto.takeover.v1.SharingState;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A pool's half of the take-over ({@code gpumemd --take-over}): writes a pool's state for a
 * successor daemon ({@link #export}) and rebuilds a pool from it ({@link #restore}), segment by
 * segment and block by block, so that the successor's pool is the same pool: same segment ids,
 * blocks, idle order, holders, counters. What the state leaves out is recomputed: the budget's
 * reserved bytes, the leased figures, the cached bytes and the free index; {@link
 * PoolInvariants} then checks the rebuilt pool whole.
 *
 * <p>Not refused but carried: client-cached blocks, segments awaiting unmaps (with the holders
 * still to confirm), the holders asked for their cached blocks. Refused, since they cannot be
 * written down: released blocks waiting for a completion event (a CUDA event is a handle of this
 * process), allocations in flight and frees under way (their segment is neither in nor out).
 *
 * <p>Stateless. {@link #export} takes the pool's lock, and opens descriptors after releasing
 * it (backend calls never run under it): the take-over runs with the daemon's request gate
 * closed, so nothing changes the pool meanwhile. {@link #restore} builds a pool nobody else
 * sees yet.
 */
final class PoolTransfer {
  private static final Logger log = LoggerFactory.getLogger(PoolTransfer.class);
  /** Counters kept outside {@link PoolCounters}, carried in their own fields. */
  private static final Set<PoolMetric> KEPT_ELSEWHERE =
      Set.of(PoolMetric.CLIENT_CACHE_HITS, PoolMetric.CLIENT_CACHE_RETURNS, PoolMetric.SHARES);

  private PoolTransfer() {}

  // ---------------------------------------------------------------------------------- export

  /** See {@link DevicePool#exportState}. */
  static PoolState export(DevicePool pool, SegmentFdSink sink) throws TakeOverRefusedException {
    int device = pool.device().ordinal();
    String backendRefusal = pool.backend.takeOverRefusal();
    if (backendRefusal != null) {
      throw new TakeOverRefusedException(backendRefusal);
    }
    PoolState.Builder state = PoolState.newBuilder();
    List<Segment> segments = new ArrayList<>();
    List<SegmentState.Builder> segmentStates = new ArrayList<>();
    pool.lock.lock();
    try {
      if (pool.closed) {
        throw new TakeOverRefusedException("device " + device + ": the pool is closed");
      }
      if (pool.events.size() > 0) {
        throw new TakeOverRefusedException("device " + device + ": " + pool.events.size() + " released blocks ("
            + pool.events.bytes() + " bytes) wait for their clients' completion events"
            + (pool.events.strandedCount() > 0 ? ", " + pool.events.strandedCount() + " of them for good (their "
            + "events could not be queried)" : "") + "; try again once they have completed");
      }
      if (pool.budget.inFlightBytes() > 0 || pool.budget.freeingBytes() > 0) {
        throw new TakeOverRefusedException("device " + device + ": backend allocations (" + pool.budget.inFlightBytes()
            + " bytes) or frees (" + pool.budget.freeingBytes() + " bytes) are under way; try again");
      }
      segments.addAll(pool.carver.live.values());
      segments.addAll(pool.holders.awaitingUnmap());
      for (Segment s : segments) {
        if (!(s.memory instanceof FdPassedSegment)) {
          throw new TakeOverRefusedException("device " + device + ": segment " + s.id + " (" + s.memory
              + ") cannot be passed as a descriptor");
        }
        segmentStates.add(segmentState(s));
      }
      for (Segment s : pool.carver.idle.inOrder()) {
        state.addIdleLru(s.id);
      }
      for (PoolMetric m : PoolMetric.values()) {
        if (m.kind() == PoolMetric.Kind.COUNTER && !KEPT_ELSEWHERE.contains(m)) {
          state.putCounters(m.protoField(), pool.counters.get(m));
        }
      }
      ClientCacheState.Builder cache = ClientCacheState.newBuilder()
          .putAllBytesByHolder(pool.clientCache.byHolder())
          .addAllReturnAsked(pool.clientCache.returnAsked())
          .setReportedHits(pool.clientCache.reportedHits())
          .setReportedReturns(pool.clientCache.reportedReturns());
      SharingCounters sharing = pool.sharing;
      state.setDevice(device)
          .setNextSegmentId(pool.carver.nextSegmentId())
          .setRetentionCapBytes(pool.eviction.retentionCapBytes())
          .setRetentionCapSetAtRuntime(pool.eviction.capSetAtRuntime())
          .setPeakLeasedBytes(pool.carver.peakLeasedBytes())
          .setLimitBytes(pool.limitBytes())
          .setDeviceUuid(pool.device().uuid())
          .setClientCache(cache)
          .setSharing(SharingState.newBuilder()
              .setShares(sharing.shares())
              .setLiveHolds(sharing.liveHolds())
              .setSharedBlocks(sharing.sharedBlocks())
              .setPublishedObjects(sharing.publishedObjects())
              .setPublishedBytes(sharing.publishedBytes()));
    } finally {
      pool.lock.unlock();
    }
    // Outside the lock, like every backend call; the closed gate keeps the segments where they are.
    for (int i = 0; i < segments.size(); i++) {
      Segment s = segments.get(i);
      SegmentFd descriptor;
      try {
        descriptor = ((FdPassedSegment) s.memory).open(false);
      } catch (IOException e) {
        throw new TakeOverRefusedException("device " + device + ": cannot open a descriptor of segment " + s.id
            + ": " + e.getMessage(), e);
      }
      if (descriptor == null) {
        throw new TakeOverRefusedException("device " + device + ": segment " + s.id + " was freed during the export");
      }
      state.addSegments(segmentStates.get(i).setDescriptorIndex(sink.add(descriptor)));
    }
    return state.build();
  }

  private static SegmentState.Builder segmentState(Segment s) {
    SegmentState.Builder b = SegmentState.newBuilder()
        .setId(s.id)
        .setOwnerKey(s.owner)
        .setBytes(s.bytes)
        .setSmall(s.small)
        .setState(s.state == Segment.State.LIVE ? SegmentState.Lifecycle.LIVE : SegmentState.Lifecycle.AWAITING_UNMAP)
        .addAllMappers(HolderMappings.mappersOf(s));
    if (s.state == Segment.State.LIVE) {
      for (Block block = s.head; block != null; block = block.next) {
        BlockState.Builder bs = BlockState.newBuilder().setOffset(block.offset).setSize(block.size);
        switch (block.state) {
          case FREE -> bs.setState(BlockState.Kind.FREE);
          case LEASED -> bs.setState(BlockState.Kind.LEASED);
          case CLIENT_CACHED -> bs.setState(BlockState.Kind.CLIENT_CACHED).setCachedBy(block.cachedBy);
          case AWAITING_EVENT -> throw new IllegalStateException("checked above: no block awaits an event");
        }
        b.addBlocks(bs);
      }
    }
    return b;
  }

  // --------------------------------------------------------------------------------- restore

  /** See {@link DevicePool#restore}. */
  static DevicePool restore(DeviceInfo device, MemoryBackend backend, PoolSettings settings,
      HolderRequests holderRequests, Ticker ticker, PoolState state, int[] descriptors)
      throws TakeOverRefusedException {
    DevicePool pool = new DevicePool(device, backend, settings, holderRequests,
        DevicePools.segmentIdBase(device.ordinal()), ticker);
    restoreInto(pool, state, descriptors);
    return pool;
  }

  /**
   * Rebuilds a predecessor's pool in {@code pool}, which must be new (no segment yet, nothing
   * served): a successor builds and binds everything else before it asks for the state, so
   * that only this is left for the pause. On failure the pool is closed and every descriptor the
   * state names is closed or relinquished.
   */
  static void restoreInto(DevicePool pool, PoolState state, int[] descriptors) throws TakeOverRefusedException {
    DeviceInfo device = pool.device();
    MemoryBackend backend = pool.backend;
    List<SegmentState> segments = state.getSegmentsList();
    Map<Integer, SegmentState> byDescriptor = new HashMap<>();
    for (SegmentState s : segments) {
      if (s.getDescriptorIndex() >= descriptors.length || byDescriptor.put(s.getDescriptorIndex(), s) != null) {
        closeAll(descriptors, byDescriptor.keySet());
        throw new TakeOverRefusedException("device " + device.ordinal() + ": segment " + s.getId()
            + " names descriptor " + s.getDescriptorIndex() + " (expected: one of its own among "
            + descriptors.length + ")");
      }
    }
    String why = check(device, backend, pool.limitBytes(), pool.publishedLimitBytes(), state);
    if (why != null) {
      closeAll(descriptors, byDescriptor.keySet());
      throw new TakeOverRefusedException("device " + device.ordinal() + ": " + why);
    }
    boolean fresh;
    pool.lock.lock();
    try {
      fresh = pool.carver.live.isEmpty() && pool.carver.nextSegmentId() == DevicePools.segmentIdBase(device.ordinal());
      if (fresh) {
        pool.carver.continueSegmentIds(state.getNextSegmentId());
      }
    } finally {
      pool.lock.unlock();
    }
    if (!fresh) {
      closeAll(descriptors, byDescriptor.keySet());
      throw new TakeOverRefusedException("device " + device.ordinal() + ": the pool already has segments of its own");
    }
    List<SegmentMemory> adopted = new ArrayList<>(segments.size());
    try {
      for (SegmentState s : segments) {
        int fd = descriptors[s.getDescriptorIndex()];
        byDescriptor.remove(s.getDescriptorIndex()); // adopt owns it from here, success or not
        try {
          adopted.add(backend.adopt(device.ordinal(), fd, s.getBytes()));
        } catch (RuntimeException e) {
          throw new TakeOverRefusedException("device " + device.ordinal() + ": cannot adopt segment " + s.getId()
              + " (" + s.getBytes() + " bytes): " + e.getMessage(), e);
        }
      }
      AfterUnlock after = new AfterUnlock(pool);
      pool.lock.lock();
      try {
        rebuild(pool, state, adopted);
        PoolInvariants.verify(pool);
        // The successor's own cap rules from now on (unless the holder's was set at run time).
        pool.eviction.enforceCap(after);
      } catch (AssertionError | RuntimeException e) {
        throw new TakeOverRefusedException("device " + device.ordinal() + ": the state does not make a pool: "
            + e.getMessage(), e);
      } finally {
        pool.lock.unlock();
      }
      after.run();
    } catch (TakeOverRefusedException e) {
      closeAll(descriptors, byDescriptor.keySet());
      pool.closed = true;
      for (SegmentMemory memory : adopted) {
        relinquishQuietly(backend, memory);
      }
      throw e;
    }
  }

  /** What the successor's configuration cannot take, or null. The state is never shrunk to fit. */
  private static String check(DeviceInfo device, MemoryBackend backend, long limitBytes, long publishedLimitBytes,
      PoolState state) {
    String refusal = backend.takeOverRefusal();
    if (refusal != null) {
      return refusal;
    }
    if (state.getDevice() != device.ordinal()) {
      return "the state is of device " + state.getDevice();
    }
    // The holder checked the Hello's UUIDs too; this side holds whatever the holder was.
    if (backend.devicesMatchByUuid() && !device.uuid().equalsIgnoreCase(state.getDeviceUuid())) {
      return "the running daemon's device " + state.getDevice() + " is "
          + (state.getDeviceUuid().isEmpty() ? "unnamed (no UUID in its state)" : state.getDeviceUuid())
          + " and this daemon's device " + device.ordinal() + " is " + device.uuid() + ": a successor must see the "
          + "same GPUs in the same order (start it with the running daemon's CUDA_VISIBLE_DEVICES)";
    }
    if (DevicePools.deviceOfSegment(state.getNextSegmentId()) != device.ordinal()
        || state.getNextSegmentId() < DevicePools.segmentIdBase(device.ordinal())) {
      return "next segment id " + state.getNextSegmentId() + " is outside the device's range";
    }
    long reserved = 0;
    for (SegmentState s : state.getSegmentsList()) {
      reserved += s.getBytes();
      if (s.getId() < DevicePools.segmentIdBase(device.ordinal()) || s.getId() >= state.getNextSegmentId()) {
        return "segment id " + s.getId() + " outside " + DevicePools.segmentIdBase(device.ordinal()) + ".."
            + (state.getNextSegmentId() - 1);
      }
    }
    if (reserved > limitBytes) {
      return "the pool holds " + reserved + " bytes of segments, over this daemon's budget of " + limitBytes
          + " bytes (--device-limit-bytes or --device-limit-fraction); what is leased stays leased, so give the new "
          + "daemon at least that budget";
    }
    if (state.getSharing().getPublishedBytes() > publishedLimitBytes) {
      return "published objects hold " + state.getSharing().getPublishedBytes() + " bytes, over this daemon's "
          + "published-bytes limit of " + publishedLimitBytes;
    }
    for (String name : state.getCountersMap().keySet()) {
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
  private static void rebuild(DevicePool pool, PoolState state, List<SegmentMemory> adopted) {
    BlockCarver carver = pool.carver;
    Map<Long, Segment> byId = new HashMap<>();
    List<SegmentState> segments = state.getSegmentsList();
    for (int i = 0; i < segments.size(); i++) {
      SegmentState s = segments.get(i);
      SegmentMemory memory = adopted.get(i);
      if (memory.bytes() != s.getBytes()) {
        throw new IllegalArgumentException("segment " + s.getId() + ": adopted " + memory.bytes() + " bytes, state says "
            + s.getBytes());
      }
      boolean live = s.getState() == SegmentState.Lifecycle.LIVE;
      if (!live && s.getState() != SegmentState.Lifecycle.AWAITING_UNMAP) {
        throw new IllegalArgumentException("segment " + s.getId() + " in state " + s.getState());
      }
      if (byId.containsKey(s.getId())) {
        throw new IllegalArgumentException("segment " + s.getId() + " twice");
      }
      Segment segment = carver.restoreSegment(s.getId(), s.getOwnerKey(), memory, s.getSmall(), live);
      byId.put(segment.id, segment);
      pool.budget.installed(segment.bytes);
      for (String mapper : s.getMappersList()) {
        pool.holders.mapped(segment, mapper);
      }
      if (!live) {
        // Evicted: wholly free, out of the index, waiting for its mappers.
        if (s.getBlocksCount() != 0 || s.getMappersCount() == 0) {
          throw new IllegalArgumentException("segment " + s.getId() + " awaiting unmap with blocks or without holders");
        }
        carver.restoreBlock(segment, null, 0, segment.bytes, true, false);
        pool.holders.awaitUnmaps(segment);
        continue;
      }
      Block prev = null;
      for (BlockState b : s.getBlocksList()) {
        boolean free = b.getState() == BlockState.Kind.FREE;
        if (!free && b.getState() != BlockState.Kind.LEASED && b.getState() != BlockState.Kind.CLIENT_CACHED) {
          throw new IllegalArgumentException("block at " + b.getOffset() + " of segment " + s.getId() + " in state "
              + b.getState());
        }
        if ((b.getState() == BlockState.Kind.CLIENT_CACHED) == b.getCachedBy().isEmpty()) {
          throw new IllegalArgumentException("block at " + b.getOffset() + " of segment " + s.getId() + " in state "
              + b.getState() + " cached by '" + b.getCachedBy() + "'");
        }
        prev = carver.restoreBlock(segment, prev, b.getOffset(), b.getSize(), free, true);
        if (b.getState() == BlockState.Kind.CLIENT_CACHED) {
          pool.clientCache.cached(prev, b.getCachedBy());
        }
      }
      if (segment.head == null) {
        throw new IllegalArgumentException("live segment " + s.getId() + " without blocks");
      }
    }
    for (long id : state.getIdleLruList()) {
      Segment segment = byId.get(id);
      if (segment == null || segment.state != Segment.State.LIVE || !segment.idle()) {
        throw new IllegalArgumentException("idle segment " + id + " is not a live, wholly free segment");
      }
      carver.idle.add(segment);
    }
    carver.restorePeak(state.getPeakLeasedBytes());
    ClientCacheState cache = state.getClientCache();
    if (!cache.getBytesByHolderMap().equals(pool.clientCache.byHolder())) {
      throw new IllegalArgumentException("client-cached bytes by holder " + cache.getBytesByHolderMap()
          + " != the blocks' " + pool.clientCache.byHolder());
    }
    cache.getReturnAskedList().forEach(pool.clientCache::restoreReturnAsked);
    pool.clientCache.reported(cache.getReportedHits(), cache.getReportedReturns());
    state.getCountersMap().forEach((name, value) -> pool.counters.add(counter(name), value));
    SharingState sharing = state.getSharing();
    pool.sharing.restore(sharing.getShares(), sharing.getLiveHolds(), sharing.getSharedBlocks(),
        sharing.getPublishedObjects(), sharing.getPublishedBytes());
    if (state.getRetentionCapSetAtRuntime()) {
      pool.eviction.restoreRuntimeCap(Math.min(state.getRetentionCapBytes(), pool.limitBytes()));
    }
  }

  private static void closeAll(int[] descriptors, Set<Integer> indexes) {
    for (int index : new HashSet<>(indexes)) {
      try {
        SegmentFd.ofNative(descriptors[index], false).close();
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
