package io.gpumemd.client;

import io.gpumemd.proto.v1.MemoryHandle;
import io.grpc.Status;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One segment as this process maps it: its mapping (and the read-only one, for read-only holds),
 * the leases on it with their tags, and whether it sleeps. Every {@link Lease} on the segment
 * refers to this object, so what changes here reaches them all: a wake maps a new segment into
 * the same address range and changes {@link #id()}, and every lease on it is then on that
 * segment, at its old offset and address, with nothing to update per lease.
 *
 * <p>Sleep (issue 35): {@link #vacate} lets the memory go and keeps the address ranges ({@link
 * SegmentMapping#vacate}); {@link #refill} maps a segment into them again, the same one (a
 * refused sleep) or the one a wake names. Which segment a range is filled from is said by a
 * {@link MemoryHandle} as a lease's reply carries it: a host file's path, or the fd channel's
 * socket for a segment passed by descriptor (host or CUDA VMM), fetched again for the refill.
 *
 * <p>Thread-safety: owned by {@link MappingCache}; every field but {@link #id} and {@link
 * #sleepLevel} (volatile, read by leases without a lock) is guarded by that cache's monitor.
 */
final class MappedSegment {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  /** The segment's id at the daemon: changes when a wake maps another segment into the range. */
  private volatile long id;
  /**
   * The segment_bytes of the reply that opened it, which its mappings were checked against: a
   * later reply on the same segment must say the same (a segment never changes size).
   */
  final long segmentBytes;
  /** How the segment was mapped (where to map it from again); null for a test's mapping. */
  MemoryHandle handle;
  /** The writable mapping (the one mapping of a legacy CUDA handle), opened on first use; or null. */
  SegmentMapping mapping;
  /** The read-only mapping of a host or CUDA VMM segment, opened by the first read-only hold; or null. */
  SegmentMapping readOnly;
  int leases;
  boolean unmapRequested;
  /** In its cache's map under {@link #id}; false once closed, or put aside by a wake (see MappingCache#wake). */
  boolean listed = true;
  /** The daemon's tag of each lease on it, counted (untagged leases are not: no tag names them). */
  private Map<String, Integer> tags;
  /** 0 while awake; else the level the segment's leases sleep at. */
  private volatile int sleepLevel;

  MappedSegment(long id, long segmentBytes, MemoryHandle handle) {
    this.id = id;
    this.segmentBytes = segmentBytes;
    this.handle = handle;
  }

  long id() {
    return id;
  }

  void renamed(long newId) {
    id = newId;
  }

  /** The host shared-memory file the segment is mapped from now, or null (a descriptor, CUDA). */
  String hostShmPath() {
    MemoryHandle h = handle;
    return h != null && h.hasHostShmPath() ? h.getHostShmPath() : null;
  }

  int sleepLevel() {
    return sleepLevel;
  }

  boolean asleep() {
    return sleepLevel > 0;
  }

  void sleeping(int level) {
    sleepLevel = level;
  }

  /** A lease with the daemon's tag {@code tag} came onto the segment. */
  void counted(String tag) {
    leases++;
    if (!tag.isEmpty()) {
      if (tags == null) {
        tags = new HashMap<>(4);
      }
      tags.merge(tag, 1, Integer::sum);
    }
  }

  /** A lease with the daemon's tag {@code tag} left the segment. */
  void uncounted(String tag) {
    leases--;
    if (!tag.isEmpty() && tags != null) {
      tags.computeIfPresent(tag, (t, n) -> n == 1 ? null : n - 1);
    }
  }

  /** True when a lease on the segment carries one of {@code wanted} (the daemon's tags). */
  boolean holdsAny(Set<String> wanted) {
    if (tags == null) {
      return false;
    }
    for (String tag : wanted) {
      if (tags.containsKey(tag)) {
        return true;
      }
    }
    return false;
  }

  /** Every mapping of the segment (one or two). */
  List<SegmentMapping> all() {
    List<SegmentMapping> all = new ArrayList<>(2);
    if (mapping != null) {
      all.add(mapping);
    }
    if (readOnly != null) {
      all.add(readOnly);
    }
    return all;
  }

  /**
   * Refuses before anything changes when a mapping cannot keep its address without its memory:
   * a legacy CUDA IPC handle is opened where the driver chooses.
   */
  void checkCanSleep() {
    for (SegmentMapping m : all()) {
      if (!m.vacatable()) {
        throw new GpuMemException(Status.Code.FAILED_PRECONDITION, "segment " + Long.toUnsignedString(id)
            + " is mapped from a legacy CUDA IPC handle, which cannot be put back at its address: a session "
            + "sleeps only on a daemon with --cuda-handles vmm", null);
      }
    }
  }

  /**
   * Vacates every mapping (address ranges kept, memory let go). On a failure, those vacated are
   * filled again from the same segment, and the failure is thrown.
   */
  void vacate(FdChannelClient fdChannel, String sessionId) {
    List<SegmentMapping> done = new ArrayList<>(2);
    try {
      for (SegmentMapping m : all()) {
        m.vacate();
        done.add(m);
      }
    } catch (RuntimeException | LinkageError e) {
      for (SegmentMapping m : done) {
        try {
          refill(m, handle, fdChannel, sessionId);
        } catch (RuntimeException | LinkageError again) {
          e.addSuppressed(again);
        }
      }
      throw e;
    }
  }

  /**
   * Maps the segment {@code from} names into every mapping's range, with the mapping's access:
   * the same segment again, or the one a wake gives. From then on the segment is {@code from}'s.
   * A mapping that fails stays vacated; the first failure is thrown after the others were tried.
   */
  void refill(MemoryHandle from, FdChannelClient fdChannel, String sessionId) {
    if (from.getSegmentBytes() != segmentBytes) {
      throw ReplyCheck.inconsistent("segment " + Long.toUnsignedString(from.getSegmentId()) + " has segment_bytes "
          + from.getSegmentBytes() + ", the range it is to fill " + segmentBytes);
    }
    RuntimeException failed = null;
    for (SegmentMapping m : all()) {
      try {
        refill(m, from, fdChannel, sessionId);
      } catch (RuntimeException e) {
        if (failed == null) {
          failed = e;
        } else {
          failed.addSuppressed(e);
        }
      }
    }
    if (failed != null) {
      throw failed;
    }
    handle = from;
  }

  /**
   * Fills the vacated ranges from the segment they were; a failure is logged and added to {@code
   * into} (when not null).
   *
   * @return false when it failed: the ranges stay vacated
   */
  boolean refillQuietly(FdChannelClient fdChannel, String sessionId, Throwable into) {
    try {
      refill(handle, fdChannel, sessionId);
      return true;
    } catch (RuntimeException | LinkageError failed) {
      log.warn("gpumemd: segment {} could not be mapped again at its address: {}", Long.toUnsignedString(id),
          failed.toString());
      if (into != null) {
        into.addSuppressed(failed);
      }
      return false;
    }
  }

  private static void refill(SegmentMapping m, MemoryHandle from, FdChannelClient fdChannel, String sessionId) {
    boolean ro = m instanceof HostMapping host ? host.readOnly() : ((CudaMappings.CudaMapping) m).readOnly;
    switch (from.getKindCase()) {
      case HOST_SHM_PATH -> host(m, from).refill(from.getHostShmPath());
      case FD_SEGMENT -> {
        HostMapping host = host(m, from);
        try (ReceivedDescriptor d = fdChannel.fetch(from.getFdSegment().getFdSocket(), sessionId,
            from.getSegmentId(), ro)) {
          host.refill(d);
        }
      }
      case CUDA_VMM -> {
        if (!(m instanceof CudaVmm.VmmMapping vmm)) {
          throw kindMismatch(from, m);
        }
        try (ReceivedDescriptor d = fdChannel.fetch(from.getCudaVmm().getFdSocket(), sessionId,
            from.getSegmentId(), ro)) {
          ReplyCheck.segmentSize("the grant of segment " + Long.toUnsignedString(from.getSegmentId()),
              d.segmentBytes(), "the mapping it refills", from.getSegmentBytes());
          vmm.refill(d.number(), from.getSegmentId());
        }
      }
      default -> throw kindMismatch(from, m);
    }
  }

  private static HostMapping host(SegmentMapping m, MemoryHandle from) {
    if (m instanceof HostMapping host) {
      return host;
    }
    throw kindMismatch(from, m);
  }

  private static GpuMemException kindMismatch(MemoryHandle from, SegmentMapping m) {
    return ReplyCheck.inconsistent("segment " + Long.toUnsignedString(from.getSegmentId()) + " comes as "
        + from.getKindCase() + ", which cannot fill a " + (m instanceof HostMapping ? "host" : "CUDA") + " mapping");
  }
}
