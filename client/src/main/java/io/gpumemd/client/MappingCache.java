package io.gpumemd.client;

import io.gpumemd.proto.v1.MemoryHandle;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.LongConsumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * This process's mappings, one per segment id, shared by the leases on that segment (a pool
 * hit on a segment already mapped costs no new mapping). A mapping is kept after its last
 * lease closes, since the next lease is likely to land on the same segment; it is closed when
 * the daemon asks (it wants to free the segment), or when the client closes.
 *
 * <p>A host segment that a read-only hold uses gets a read-only mapping of its own (never the
 * writable one); the segment's one or two mappings count and close together. A segment passed
 * by descriptor is fetched from the fd channel ({@link FdChannelClient}, once per mapping),
 * mapped, and its descriptor closed at once.
 *
 * <p>CUDA: a lease's device is the daemon's ordinal, found among this process's devices by
 * uuid ({@link CudaContexts#localDevice}). Closing a CUDA mapping first waits for the work
 * queued in its context, which may still use the memory. A mapping that fails to close is
 * logged and the others are closed still; a requested unmap is acknowledged either way (the
 * process holds nothing more it could let go of).
 *
 * <p>Thread-safe: all state is guarded by this object's monitor. The unmap acknowledgement is
 * sent after the mapping is closed, outside the monitor.
 */
final class MappingCache {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  private static final class Entry {
    /** The writable mapping (the one mapping of a legacy CUDA handle), opened on first use; or null. */
    SegmentMapping mapping;
    /**
     * The read-only mapping of a host or CUDA VMM segment, opened by the first read-only hold;
     * or null.
     */
    SegmentMapping readOnly;
    int leases;
    boolean unmapRequested;
    /**
     * The segment_bytes of the reply that opened the entry, which its mappings were checked
     * against: a later reply on the same segment must say the same (a segment never changes
     * size), since its offsets are checked against what it says.
     */
    final long segmentBytes;

    Entry(long segmentBytes) {
      this.segmentBytes = segmentBytes;
    }

    /** Every mapping of the entry (one or two). */
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
  }

  private final Map<Long, Entry> entries = new HashMap<>();
  private final LongConsumer ackUnmapped;
  /** Where segments passed by descriptor come from; the client's one connection. */
  final FdChannelClient fdChannel;
  /** The session whose holds the fd channel checks. */
  final String sessionId;
  /** The daemon's CUDA devices by ordinal, with their uuids (OpenSessionResponse.devices). */
  private final Map<Integer, String> deviceUuids;
  private long mapsOpened;

  /**
   * @param ackUnmapped told the segment id once a requested unmap is done
   * @param fdChannel the client's fd channel
   * @param sessionId the session this cache maps for
   * @param deviceUuids the daemon's devices by ordinal with their uuids; empty from a daemon
   *     that predates them (ordinals are then taken as they are)
   */
  MappingCache(LongConsumer ackUnmapped, FdChannelClient fdChannel, String sessionId, Map<Integer, String> deviceUuids) {
    this.ackUnmapped = ackUnmapped;
    this.fdChannel = fdChannel;
    this.sessionId = sessionId;
    this.deviceUuids = Map.copyOf(deviceUuids);
  }

  /**
   * The mapping of a lease's or hold's segment, opened on first use; counts the lease. With
   * {@code readOnly}, a host or CUDA VMM segment's read-only mapping (the driver enforces it on
   * VMM); with a legacy CUDA handle the one mapping (read-only is advisory there: a legacy IPC
   * handle cannot be opened read-only).
   */
  synchronized SegmentMapping acquire(int device, MemoryHandle handle, boolean readOnly) {
    Entry entry = entries.get(handle.getSegmentId());
    boolean opened = false;
    if (entry == null) {
      entry = new Entry(handle.getSegmentBytes());
      opened = true;
    } else if (entry.segmentBytes != handle.getSegmentBytes()) {
      throw ReplyCheck.inconsistent("segment " + Long.toUnsignedString(handle.getSegmentId())
          + " is mapped here with segment_bytes " + entry.segmentBytes + ", this reply says " + handle.getSegmentBytes());
    }
    SegmentMapping mapping;
    switch (handle.getKindCase()) {
      case HOST_SHM_PATH -> {
        if (readOnly) {
          if (entry.readOnly == null) {
            entry.readOnly = new HostMapping(handle.getHostShmPath(), handle.getSegmentBytes(), true);
            mapsOpened++;
          }
          mapping = entry.readOnly;
        } else {
          if (entry.mapping == null) {
            entry.mapping = new HostMapping(handle.getHostShmPath(), handle.getSegmentBytes(), false);
            mapsOpened++;
          }
          mapping = entry.mapping;
        }
      }
      case FD_SEGMENT -> {
        if (readOnly ? entry.readOnly == null : entry.mapping == null) {
          HostMapping host = fetchHost(handle, readOnly);
          mapping = place(entry, handle.getSegmentId(), host, readOnly || host.readOnly());
        } else {
          mapping = readOnly ? entry.readOnly : entry.mapping;
        }
      }
      case CUDA_IPC_HANDLE -> {
        if (entry.mapping == null) {
          entry.mapping = CudaMappings.openLegacy(CudaContexts.localDevice(device, deviceUuids),
              handle.getCudaIpcHandle().toByteArray(), handle.getSegmentId(), handle.getSegmentBytes());
          mapsOpened++;
        }
        mapping = entry.mapping;
      }
      case CUDA_VMM -> {
        if (readOnly ? entry.readOnly == null : entry.mapping == null) {
          Imported vmm = importVmm(device, handle, readOnly);
          mapping = place(entry, handle.getSegmentId(), vmm.mapping(), vmm.readOnly());
        } else {
          mapping = readOnly ? entry.readOnly : entry.mapping;
        }
      }
      default -> throw new GpuMemException(io.grpc.Status.Code.INTERNAL,
          "lease response carries no memory handle", null);
    }
    if (opened) {
      entries.put(handle.getSegmentId(), entry);
    }
    entry.leases++;
    return mapping;
  }

  /**
   * A host segment's descriptor from the fd channel, mapped (read-only when asked, or when the
   * daemon grants only that) and closed.
   */
  private HostMapping fetchHost(MemoryHandle handle, boolean readOnly) {
    ReceivedDescriptor descriptor;
    try {
      descriptor = fdChannel.fetch(handle.getFdSegment().getFdSocket(), sessionId, handle.getSegmentId(), readOnly);
    } catch (GpuMemException e) {
      if (e.code() != io.grpc.Status.Code.NOT_FOUND) {
        throw e;
      }
      // The session was just granted a block of the segment: the channel not knowing it means
      // this process is not the session's tenant to the channel (which knows callers by uid).
      throw new GpuMemException(io.grpc.Status.Code.FAILED_PRECONDITION, "segment " + handle.getSegmentId()
          + " is passed as a file descriptor (--host-segments fd), and the fd channel refused it to this process: "
          + e.serverMessage() + ". Sessions of bearer-token or certificate tenants cannot receive descriptors: "
          + "the daemon needs --host-segments path for them", e);
    }
    try {
      checkGrant(descriptor, handle);
    } catch (GpuMemException e) {
      descriptor.close();
      throw e;
    }
    return descriptor.mapHost(); // which checks the descriptor's own size (fstat) against the grant
  }

  /**
   * A CUDA VMM segment: the device matched by uuid (before anything is fetched), the descriptor
   * from the fd channel, imported and mapped (read-only access when asked or granted), and closed.
   */
  private Imported importVmm(int device, MemoryHandle handle, boolean readOnly) {
    int localDevice = CudaContexts.localDevice(device, deviceUuids);
    try (ReceivedDescriptor descriptor = fdChannel.fetch(handle.getCudaVmm().getFdSocket(), sessionId,
        handle.getSegmentId(), readOnly)) {
      checkGrant(descriptor, handle);
      boolean mappedReadOnly = readOnly || descriptor.readOnly();
      // A VMM descriptor has no file size to fstat: cuMemMap of segment_bytes checks the allocation.
      return new Imported(CudaVmm.importSegment(localDevice, descriptor.number(), handle.getSegmentId(),
          descriptor.segmentBytes(), mappedReadOnly), mappedReadOnly);
    }
  }

  /** A VMM mapping and whether it has read-only access. */
  private record Imported(SegmentMapping mapping, boolean readOnly) {}

  /**
   * Keeps a new mapping in the slot of what it is, not of what was asked: the daemon may grant
   * only read-only when writable was asked (the session holds only read-only holds there by
   * then), and a read-only mapping in the writable slot would fault a later writable lease on
   * its first write. Where a read-only mapping is open already, it serves and the new one closes.
   * Called with the monitor held.
   */
  private SegmentMapping place(Entry entry, long segmentId, SegmentMapping mapping, boolean mappedReadOnly) {
    if (!mappedReadOnly) {
      entry.mapping = mapping;
    } else if (entry.readOnly == null) {
      entry.readOnly = mapping;
    } else {
      closeQuietly(segmentId, List.of(mapping));
      return entry.readOnly;
    }
    mapsOpened++;
    return mapping;
  }

  /** The fd channel's grant must give the segment the size the lease's reply gave it. */
  private static void checkGrant(ReceivedDescriptor descriptor, MemoryHandle handle) {
    if (descriptor.segmentBytes() != handle.getSegmentBytes()) {
      throw ReplyCheck.inconsistent("segment " + Long.toUnsignedString(handle.getSegmentId()) + ": the fd channel's "
          + "grant says segment_bytes " + descriptor.segmentBytes() + ", the lease's reply " + handle.getSegmentBytes());
    }
  }

  /**
   * Tests: counts a lease on a mapping made elsewhere, as {@link #acquire} does for one it opens
   * (a mapping that fails to close exists only on a GPU).
   */
  synchronized void track(long segmentId, SegmentMapping mapping) {
    Entry entry = entries.computeIfAbsent(segmentId, id -> new Entry(-1)); // no reply: no size to hold to
    entry.mapping = mapping;
    entry.leases++;
  }

  /** A lease on the segment closed. */
  void release(long segmentId) {
    List<SegmentMapping> toClose = null;
    synchronized (this) {
      Entry entry = entries.get(segmentId);
      if (entry == null) {
        return;
      }
      entry.leases--;
      if (entry.leases == 0 && entry.unmapRequested) {
        entries.remove(segmentId);
        toClose = entry.all();
      }
    }
    if (toClose != null) {
      closeQuietly(segmentId, toClose);
      ackUnmapped.accept(segmentId);
    }
  }

  /** The daemon asks to unmap a segment: now if no lease uses it, else when the last closes. */
  void unmapRequested(long segmentId) {
    List<SegmentMapping> toClose = List.of();
    synchronized (this) {
      Entry entry = entries.get(segmentId);
      if (entry == null) {
        // Never mapped here (or already closed): nothing holds it.
      } else if (entry.leases == 0) {
        entries.remove(segmentId);
        toClose = entry.all();
      } else {
        entry.unmapRequested = true;
        return;
      }
    }
    closeQuietly(segmentId, toClose);
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
    Map<Long, List<SegmentMapping>> toClose = new HashMap<>();
    synchronized (this) {
      entries.forEach((segmentId, e) -> {
        List<SegmentMapping> cuda = e.all().stream().filter(m -> !(m instanceof HostMapping)).toList();
        if (!cuda.isEmpty()) {
          toClose.put(segmentId, cuda);
        }
      });
      entries.clear();
    }
    toClose.forEach(this::closeQuietly);
  }

  /** This process's CUDA devices that the mappings live on (see {@link SegmentMapping#cudaDevice}). */
  synchronized Set<Integer> cudaDevices() {
    Set<Integer> devices = new TreeSet<>();
    for (Entry e : entries.values()) {
      for (SegmentMapping m : e.all()) {
        if (m.cudaDevice() >= 0) {
          devices.add(m.cudaDevice());
        }
      }
    }
    return devices;
  }

  /** Closes every mapping (the client is closing). */
  void closeAll() {
    Map<Long, List<SegmentMapping>> all = new HashMap<>();
    synchronized (this) {
      entries.forEach((segmentId, e) -> all.put(segmentId, e.all()));
      entries.clear();
    }
    all.forEach(this::closeQuietly);
  }

  /**
   * Closes a segment's mappings, each even when another fails; a failure is logged (the
   * mapping is as closed as it can be: retrying would not help).
   */
  private void closeQuietly(long segmentId, List<SegmentMapping> mappings) {
    for (SegmentMapping mapping : mappings) {
      try {
        mapping.close();
      } catch (RuntimeException | LinkageError e) {
        log.warn("gpumemd: unmapping segment {} failed: {}", segmentId, e.toString());
      }
    }
  }
}
