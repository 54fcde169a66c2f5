package io.gpumemd.client;

import io.gpumemd.proto.v1.MemoryHandle;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.LongConsumer;

/**
 * This process's mappings, one per segment id, shared by the leases on that segment (a pool
 * hit on a segment already mapped costs no new mapping). A mapping is kept after its last
 * lease closes, since the next lease is likely to land on the same segment; it is closed when
 * the daemon asks (it wants to free the segment), or when the client closes.
 *
 * <p>Thread-safe: all state is guarded by this object's monitor. The unmap acknowledgement is
 * sent after the mapping is closed, outside the monitor.
 */
final class MappingCache {
  private static final class Entry {
    final SegmentMapping mapping;
    int leases;
    boolean unmapRequested;

    Entry(SegmentMapping mapping) {
      this.mapping = mapping;
    }
  }

  private final Map<Long, Entry> entries = new HashMap<>();
  private final LongConsumer ackUnmapped;
  private long mapsOpened;

  /** @param ackUnmapped told the segment id once a requested unmap is done */
  MappingCache(LongConsumer ackUnmapped) {
    this.ackUnmapped = ackUnmapped;
  }

  /** The mapping of a lease's segment, opened on first use; counts the lease. */
  synchronized SegmentMapping acquire(int device, MemoryHandle handle) {
    Entry entry = entries.get(handle.getSegmentId());
    if (entry == null) {
      SegmentMapping mapping = switch (handle.getKindCase()) {
        case HOST_SHM_PATH -> new HostMapping(handle.getHostShmPath(), handle.getSegmentBytes());
        case CUDA_IPC_HANDLE -> CudaMappings.open(device, handle.getCudaIpcHandle().toByteArray());
        default -> throw new GpuMemException(io.grpc.Status.Code.INTERNAL,
            "lease response carries no memory handle", null);
      };
      entry = new Entry(mapping);
      entries.put(handle.getSegmentId(), entry);
      mapsOpened++;
    }
    entry.leases++;
    return entry.mapping;
  }

  /** A lease on the segment closed. */
  void release(long segmentId) {
    SegmentMapping toClose = null;
    synchronized (this) {
      Entry entry = entries.get(segmentId);
      if (entry == null) {
        return;
      }
      entry.leases--;
      if (entry.leases == 0 && entry.unmapRequested) {
        entries.remove(segmentId);
        toClose = entry.mapping;
      }
    }
    if (toClose != null) {
      toClose.close();
      ackUnmapped.accept(segmentId);
    }
  }

  /** The daemon asks to unmap a segment: now if no lease uses it, else when the last closes. */
  void unmapRequested(long segmentId) {
    SegmentMapping toClose = null;
    synchronized (this) {
      Entry entry = entries.get(segmentId);
      if (entry == null) {
        // Never mapped here (or already closed): nothing holds it.
      } else if (entry.leases == 0) {
        entries.remove(segmentId);
        toClose = entry.mapping;
      } else {
        entry.unmapRequested = true;
        return;
      }
    }
    if (toClose != null) {
      toClose.close();
    }
    ackUnmapped.accept(segmentId);
  }

  /** Mappings currently open. */
  synchronized int size() {
    return entries.size();
  }

  /** Mappings opened since start (each one a new mmap or cuIpcOpenMemHandle). */
  synchronized long mapsOpened() {
    return mapsOpened;
  }

  /**
   * Drops every mapping: the session is lost, and its segment ids will mean other segments of a
   * restarted daemon. CUDA mappings are closed now (a stale device pointer then faults on the
   * GPU, reported by CUDA); host mappings are left to the garbage collector, which unmaps them
   * once no buffer of a dead lease refers to them, so that such a buffer never touches unmapped
   * memory (the file behind it is the old daemon's, unlinked or not, never truncated).
   */
  void abandonAll() {
    List<SegmentMapping> toClose;
    synchronized (this) {
      toClose = new ArrayList<>();
      entries.values().forEach(e -> {
        if (!(e.mapping instanceof HostMapping)) {
          toClose.add(e.mapping);
        }
      });
      entries.clear();
    }
    for (SegmentMapping mapping : toClose) {
      try {
        mapping.close();
      } catch (RuntimeException e) {
        // the exporting process is gone: nothing more to do
      }
    }
  }

  /** Closes every mapping (the client is closing). */
  void closeAll() {
    List<SegmentMapping> all;
    synchronized (this) {
      all = new ArrayList<>();
      entries.values().forEach(e -> all.add(e.mapping));
      entries.clear();
    }
    all.forEach(SegmentMapping::close);
  }
}
