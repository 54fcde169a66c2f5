package io.gpumemd.server.grpc;

import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.FieldDescriptor;
import io.gpumemd.proto.v1.DeviceInfo;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.FdSegment;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.SegmentWake;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.MemoryHandle;
import io.gpumemd.proto.v1.ObjectInfo;
import io.gpumemd.server.offload.ParkedRange;
import io.gpumemd.server.sharing.PublishedObject;
import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionSleep;
import io.gpumemd.server.sharing.ShareToken;
import java.util.EnumMap;
import java.util.Map;

/**
 * The one place where domain objects become protobuf messages. Pool figures map by name: each
 * {@link PoolMetric} fills the {@code DeviceStats} field it names, so a figure added to the
 * pool reaches {@code GetStats} without a line here. Stateless and thread-safe.
 */
final class ProtoMapping {
  private static final Map<PoolMetric, FieldDescriptor> STATS_FIELDS = statsFields();

  private ProtoMapping() {}

  private static Map<PoolMetric, FieldDescriptor> statsFields() {
    Map<PoolMetric, FieldDescriptor> fields = new EnumMap<>(PoolMetric.class);
    for (PoolMetric metric : PoolMetric.values()) {
      FieldDescriptor field = DeviceStats.getDescriptor().findFieldByName(metric.protoField());
      if (field == null || field.getJavaType() != FieldDescriptor.JavaType.LONG) {
        throw new ExceptionInInitializerError("DeviceStats has no int64 field " + metric.protoField());
      }
      fields.put(metric, field);
    }
    return fields;
  }

  static DeviceStats deviceStats(PoolStats stats) {
    DeviceStats.Builder out = DeviceStats.newBuilder().setDevice(stats.device());
    STATS_FIELDS.forEach((metric, field) -> out.setField(field, stats.get(metric)));
    return out.build();
  }

  static DeviceInfo deviceInfo(DevicePool pool) {
    var d = pool.device();
    return DeviceInfo.newBuilder()
        .setDevice(d.ordinal()).setName(d.name()).setUuid(d.uuid()).setBackend(d.backend())
        .setCapacityBytes(d.capacityBytes()).setFreeBytesAtStart(d.freeBytesAtStart())
        .setLimitBytes(pool.limitBytes())
        .setRetentionCapBytes(pool.stats().get(PoolMetric.RETENTION_CAP_BYTES))
        .setCudaHandles(d.cudaHandles())
        .build();
  }

  /** Sets the handle's kind from a segment's IpcHandle. */
  static MemoryHandle.Builder setKind(MemoryHandle.Builder handle, IpcHandle ipc) {
    // The kinds of the sealed IpcHandle (a pattern switch once the project is on Java 21).
    if (ipc instanceof IpcHandle.CudaIpc cuda) {
      handle.setCudaIpcHandle(ByteString.copyFrom(cuda.bytes()));
    } else if (ipc instanceof IpcHandle.HostFd fd) {
      handle.setFdSegment(FdSegment.newBuilder().setFdSocket(fd.fdSocket()));
    } else if (ipc instanceof IpcHandle.CudaVmm vmm) {
      handle.setCudaVmm(FdSegment.newBuilder().setFdSocket(vmm.fdSocket()));
    } else {
      handle.setHostShmPath(((IpcHandle.HostShm) ipc).path());
    }
    return handle;
  }

  static LeaseResponse leaseResponse(LeaseRecord lease) {
    Block block = lease.block();
    MemoryHandle.Builder handle = MemoryHandle.newBuilder()
        .setSegmentId(block.segmentId())
        .setSegmentBytes(block.segmentBytes())
        .setOffset(block.offset());
    setKind(handle, block.memory().handle());
    return LeaseResponse.newBuilder()
        .setLeaseId(lease.id())
        .setDevice(block.device())
        .setSizeBytes(lease.sizeBytes())
        .setBlockBytes(block.size())
        .setPoolHit(lease.poolHit())
        .setHandle(handle)
        .build();
  }

  /** One woken segment: the new segment's handle (offset 0) for the old one's range. */
  static SegmentWake segmentWake(SessionSleep.Woken woken) {
    Block block = woken.leases().get(0).block();
    MemoryHandle.Builder handle = MemoryHandle.newBuilder().setSegmentId(block.segmentId())
        .setSegmentBytes(block.segmentBytes()).setOffset(0);
    setKind(handle, block.memory().handle());
    SegmentWake.Builder out = SegmentWake.newBuilder().setOldSegmentId(woken.oldSegmentId()).setHandle(handle);
    woken.leases().forEach(lease -> out.addLeaseIds(lease.id()));
    return out.build();
  }

  static LeaseInfo leaseInfo(LeaseRecord lease, long ageMillis) {
    Block block = lease.block();
    LeaseInfo.Builder out = LeaseInfo.newBuilder()
        .setLeaseId(lease.id()).setSessionId(lease.session().id())
        .setClientName(lease.session().clientName()).setDevice(block.device())
        .setSizeBytes(lease.sizeBytes()).setBlockBytes(block.size()).setTag(lease.tag())
        .setAgeMs(ageMillis)
        .setSegmentId(block.segmentId()).setOffset(block.offset())
        .setAttached(lease.attached()).setReadOnly(lease.readOnly())
        .setHolds(1);
    LeaseRecord.Asleep asleep = lease.asleep();
    if (asleep != null) {
      out.setSleepLevel(asleep.level());
    }
    SharedBlock shared = lease.shared();
    if (shared != null) {
      out.setHolds(shared.holds()).setObjectName(shared.name()).addAllHolderSessionIds(shared.holderSessionIds());
    }
    return out.build();
  }

  static ObjectInfo objectInfo(PublishedObject object, long ageMillis) {
    SharedBlock shared = object.shared();
    Block block = shared.block();
    ParkedRange parked = shared.parkedRange();
    return ObjectInfo.newBuilder()
        .setName(object.name()).setTenant(object.tenant()).setDevice(block.device())
        .setSizeBytes(shared.sizeBytes()).setBlockBytes(block.size())
        .setHolds(shared.holds()).setHolders(shared.holderSessionIds().size())
        .setAgeMs(ageMillis).setReadOnly(object.readOnly()).setPublishedBy(object.publishedBy())
        .setSegmentId(block.segmentId()).setOffset(block.offset())
        .setLookups(object.lookups().get())
        .setParked(parked != null).setHostBytes(parked == null ? 0 : parked.length())
        .build();
  }

  static SessionInfo sessionInfo(Session session, long ageMillis, int mappedSegments) {
    long[] holdings = session.holdings();
    long[] counters = session.clientCounters();
    long[] sleep = session.sleepFigures();
    return SessionInfo.newBuilder()
        .setSessionId(session.id()).setClientName(session.clientName())
        .setLeases(holdings[0]).setLeasedBytes(holdings[1])
        .setAgeMs(ageMillis)
        .setStreamAttached(session.streamAttached()).setTtlSeconds(session.ttlSeconds())
        .setMappedSegments(mappedSegments)
        .setClientCachedBytes(holdings[2])
        .setClientCacheAllowanceBytes(session.cacheAllowance())
        .setClientCacheHits(counters[0])
        .setClientCacheReturns(counters[1])
        .setTenant(session.tenant()).setPeer(session.owner().principal())
        .setAttachedHolds(holdings[3]).setAttachedBytes(holdings[4])
        .setSleepingLeases(sleep[0]).setHostBytes(sleep[1])
        .build();
  }

  static ShareInfo shareInfo(ShareToken token, long ageMillis, long expiresInMillis) {
    SharedBlock shared = token.shared();
    Block block = shared.block();
    int attaches = token.attaches();
    return ShareInfo.newBuilder()
        .setShareId(token.id()).setTenant(token.tenant()).setSessionId(token.sessionId())
        .setClientName(token.clientName()).setLeaseId(token.leaseId())
        .setDevice(block.device()).setSegmentId(block.segmentId()).setOffset(block.offset())
        .setSizeBytes(shared.sizeBytes()).setBlockBytes(block.size()).setReadOnly(token.readOnly())
        .setMaxAttaches(token.maxAttaches()).setAttaches(attaches)
        .setAttachesLeft(token.maxAttaches() == 0 ? -1 : Math.max(0, token.maxAttaches() - attaches))
        .setExpiresInMs(Math.max(0, expiresInMillis)).setAgeMs(ageMillis).setHolds(shared.holds())
        .build();
  }
}
