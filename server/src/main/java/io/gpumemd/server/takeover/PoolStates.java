package io.gpumemd.server.takeover;

import io.gpumemd.proto.takeover.v1.BlockState;
import io.gpumemd.proto.takeover.v1.ClientCacheState;
import io.gpumemd.proto.takeover.v1.PoolState;
import io.gpumemd.proto.takeover.v1.SegmentState;
import io.gpumemd.proto.takeover.v1.SharingState;
import io.gpumemd.server.pool.PoolSnapshot;
import io.gpumemd.server.pool.PoolSnapshot.BlockKind;
import io.gpumemd.server.pool.PoolSnapshot.BlockSnapshot;
import io.gpumemd.server.pool.PoolSnapshot.Lifecycle;
import io.gpumemd.server.pool.PoolSnapshot.SegmentSnapshot;
import java.util.ArrayList;
import java.util.List;

/**
 * A pool's {@link PoolSnapshot} to and from the take-over's wire message {@link PoolState}, field
 * for field (as {@code grpc/ProtoMapping} does for the public API): the pool never sees the wire
 * types. A wire enum value this daemon does not know maps to null, which the pool's restore
 * refuses. Stateless.
 */
public final class PoolStates {
  private PoolStates() {}

  public static PoolState toProto(PoolSnapshot p) {
    PoolState.Builder out = PoolState.newBuilder()
        .setDevice(p.device())
        .setNextSegmentId(p.nextSegmentId())
        .addAllIdleLru(p.idleLru())
        .putAllCounters(p.counters())
        .setRetentionCapBytes(p.retentionCapBytes())
        .setRetentionCapSetAtRuntime(p.retentionCapSetAtRuntime())
        .setPeakLeasedBytes(p.peakLeasedBytes())
        .setLimitBytes(p.limitBytes())
        .setDeviceUuid(p.deviceUuid())
        .setClientCache(ClientCacheState.newBuilder()
            .putAllBytesByHolder(p.clientCache().bytesByHolder())
            .addAllReturnAsked(p.clientCache().returnAsked())
            .setReportedHits(p.clientCache().reportedHits())
            .setReportedReturns(p.clientCache().reportedReturns()))
        .setSharing(SharingState.newBuilder()
            .setShares(p.sharing().shares())
            .setLiveHolds(p.sharing().liveHolds())
            .setSharedBlocks(p.sharing().sharedBlocks())
            .setPublishedObjects(p.sharing().publishedObjects())
            .setPublishedBytes(p.sharing().publishedBytes()));
    for (SegmentSnapshot s : p.segments()) {
      out.addSegments(toProto(s));
    }
    return out.build();
  }

  private static SegmentState toProto(SegmentSnapshot s) {
    SegmentState.Builder out = SegmentState.newBuilder()
        .setId(s.id())
        .setOwnerKey(s.ownerKey())
        .setBytes(s.bytes())
        .setSmall(s.small())
        .setDescriptorIndex(s.descriptorIndex())
        .setState(s.state() == Lifecycle.LIVE ? SegmentState.Lifecycle.LIVE : SegmentState.Lifecycle.AWAITING_UNMAP)
        .addAllMappers(s.mappers());
    for (BlockSnapshot b : s.blocks()) {
      BlockState.Builder block = BlockState.newBuilder().setOffset(b.offset()).setSize(b.size());
      switch (b.state()) {
        case FREE -> block.setState(BlockState.Kind.FREE);
        case LEASED -> block.setState(BlockState.Kind.LEASED);
        case CLIENT_CACHED -> block.setState(BlockState.Kind.CLIENT_CACHED).setCachedBy(b.cachedBy());
      }
      out.addBlocks(block);
    }
    return out.build();
  }

  public static PoolSnapshot fromProto(PoolState p) {
    List<SegmentSnapshot> segments = new ArrayList<>(p.getSegmentsCount());
    for (SegmentState s : p.getSegmentsList()) {
      segments.add(fromProto(s));
    }
    ClientCacheState cache = p.getClientCache();
    SharingState sharing = p.getSharing();
    return new PoolSnapshot(p.getDevice(), p.getDeviceUuid(), p.getNextSegmentId(), segments, p.getIdleLruList(),
        p.getCountersMap(), p.getRetentionCapBytes(), p.getRetentionCapSetAtRuntime(), p.getPeakLeasedBytes(),
        p.getLimitBytes(),
        new PoolSnapshot.ClientCache(cache.getBytesByHolderMap(), cache.getReturnAskedList(), cache.getReportedHits(),
            cache.getReportedReturns()),
        new PoolSnapshot.Sharing(sharing.getShares(), sharing.getLiveHolds(), sharing.getSharedBlocks(),
            sharing.getPublishedObjects(), sharing.getPublishedBytes()));
  }

  private static SegmentSnapshot fromProto(SegmentState s) {
    Lifecycle state = switch (s.getState()) {
      case LIVE -> Lifecycle.LIVE;
      case AWAITING_UNMAP -> Lifecycle.AWAITING_UNMAP;
      default -> null;
    };
    List<BlockSnapshot> blocks = new ArrayList<>(s.getBlocksCount());
    for (BlockState b : s.getBlocksList()) {
      BlockKind kind = switch (b.getState()) {
        case FREE -> BlockKind.FREE;
        case LEASED -> BlockKind.LEASED;
        case CLIENT_CACHED -> BlockKind.CLIENT_CACHED;
        default -> null;
      };
      blocks.add(new BlockSnapshot(b.getOffset(), b.getSize(), kind, b.getCachedBy()));
    }
    return new SegmentSnapshot(s.getId(), s.getOwnerKey(), s.getBytes(), s.getSmall(), s.getDescriptorIndex(), state,
        blocks, s.getMappersList());
  }
}
