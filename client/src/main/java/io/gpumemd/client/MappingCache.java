package io.gpumemd.client;

import io.gpumemd.proto.v1.MemoryHandle;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
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
 * <p>Sleep and wake (issue 35): a segment is a {@link MappedSegment}, to which its leases refer.
 * A sleep vacates segments, address ranges kept ({@link #vacateForSleep}); a wake fills each
 * range from the segment the daemon names and files it under that id ({@link #wake}): its
 * leases move with it.
 *
 * <p>Thread-safe: all state is guarded by this object's monitor. The unmap acknowledgement is
 * sent after the mapping is closed, outside the monitor.
 */
final class MappingCache {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  private final Map<Long, MappedSegment> entries = new HashMap<>();
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

  /** A lease's segment and the mapping it uses there (the segment's writable or read-only one). */
  record Acquired(MappedSegment segment, SegmentMapping mapping) {}

  /**
   * The mapping of a lease's or hold's segment, opened on first use; counts the lease, under
   * the daemon's {@code tag} for it. With {@code readOnly}, a host or CUDA VMM segment's
   * read-only mapping (the driver enforces it on VMM); with a legacy CUDA handle the one mapping
   * (read-only is advisory there: a legacy IPC handle cannot be opened read-only).
   */
  synchronized Acquired acquire(int device, MemoryHandle handle, boolean readOnly, String tag) {
    MappedSegment entry = entries.get(handle.getSegmentId());
    boolean opened = false;
    if (entry == null) {
      entry = new MappedSegment(handle.getSegmentId(), handle.getSegmentBytes(), handle);
      opened = true;
    } else if (entry.segmentBytes != handle.getSegmentBytes()) {
      throw ReplyCheck.inconsistent("segment " + Long.toUnsignedString(handle.getSegmentId())
          + " is mapped here with segment_bytes " + entry.segmentBytes + ", this reply says " + handle.getSegmentBytes());
    } else if (entry.asleep()) {
      // Its range is vacated: a buffer or pointer on it would fault.
      throw ReplyCheck.inconsistent("segment " + Long.toUnsignedString(handle.getSegmentId())
          + " sleeps, and the daemon granted a block in it");
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
    entry.counted(tag);
    return new Acquired(entry, mapping);
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
  private SegmentMapping place(MappedSegment entry, long segmentId, SegmentMapping mapping, boolean mappedReadOnly) {
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
    // No reply: no size to hold to, no handle to map it from again.
    MappedSegment entry = entries.computeIfAbsent(segmentId, id -> new MappedSegment(id, -1, null));
    entry.mapping = mapping;
    entry.counted("");
  }

  /** Tests: a lease on the segment with this id closed (see {@link #release(Lease)}). */
  void release(long segmentId) {
    MappedSegment entry = segment(segmentId);
    if (entry != null) {
      release(entry, "");
    }
  }

  private synchronized MappedSegment segment(long segmentId) {
    return entries.get(segmentId);
  }

  /** A lease closed: it no longer uses its segment's mapping. */
  void release(Lease lease) {
    MappedSegment segment = lease.segment();
    if (segment != null) { // null: a test's lease, mapped nowhere
      release(segment, lease.recordTag());
    }
  }

  /**
   * A lease left the segment. The segment's last lease closes its mappings when the daemon asked
   * for it (acknowledged), or when it sleeps (the sleep was the unmap's confirmation; nothing of
   * this process is left to wake there).
   */
  private void release(MappedSegment entry, String tag) {
    List<SegmentMapping> toClose = null;
    boolean ack;
    synchronized (this) {
      entry.uncounted(tag);
      if (entry.leases > 0 || !entry.listed || !(entry.unmapRequested || entry.asleep())) {
        return;
      }
      ack = entry.unmapRequested;
      toClose = entry.all();
      unlist(entry);
    }
    closeQuietly(entry.id(), toClose);
    if (ack) {
      ackUnmapped.accept(entry.id());
    }
  }

  /** Removes a segment from the map; called with the monitor held. */
  private void unlist(MappedSegment entry) {
    if (entry.listed) {
      entries.remove(entry.id());
      entry.listed = false;
    }
  }

  /** The daemon asks to unmap a segment: now if no lease uses it, else when the last closes. */
  void unmapRequested(long segmentId) {
    List<SegmentMapping> toClose = List.of();
    synchronized (this) {
      MappedSegment entry = entries.get(segmentId);
      if (entry == null) {
        // Never mapped here (or already closed): nothing holds it.
      } else if (entry.leases == 0) {
        unlist(entry);
        toClose = entry.all();
      } else {
        entry.unmapRequested = true;
        return;
      }
    }
    closeQuietly(segmentId, toClose);
    ackUnmapped.accept(segmentId);
  }

  // ---------------------------------------------------------------------------- sleep and wake

  /** What a sleep let go of: the segments it vacated, and the ids of those it closed (no lease on them). */
  record Vacated(List<MappedSegment> segments, List<Long> closedIds) {
    List<Long> ids() {
      List<Long> ids = new ArrayList<>(closedIds);
      segments.forEach(e -> ids.add(e.id()));
      return ids;
    }
  }

  /**
   * Before a sleep: vacates every awake segment with a lease on it (with {@code tags}, a lease
   * the daemon knows by one of them), and closes the mappings no lease uses (acknowledged as
   * unmapped: the daemon can free their segments too). A refusal (a legacy CUDA mapping) comes
   * before anything changes; a failure partway fills again what was vacated, and is thrown.
   */
  Vacated vacateForSleep(Set<String> tags) {
    List<MappedSegment> chosen = new ArrayList<>();
    List<MappedSegment> idle = new ArrayList<>();
    synchronized (this) {
      for (MappedSegment e : entries.values()) {
        if (e.asleep()) {
          continue;
        }
        if (e.leases == 0) {
          idle.add(e);
        } else if (tags.isEmpty() || e.holdsAny(tags)) {
          e.checkCanSleep();
          chosen.add(e);
        }
      }
      idle.forEach(this::unlist);
      List<MappedSegment> done = new ArrayList<>(chosen.size());
      try {
        for (MappedSegment e : chosen) {
          e.vacate(fdChannel, sessionId);
          done.add(e);
        }
      } catch (RuntimeException | LinkageError e) {
        done.forEach(d -> d.refillQuietly(fdChannel, sessionId, e));
        throw e;
      }
    }
    List<Long> closed = new ArrayList<>(idle.size());
    for (MappedSegment e : idle) {
      closeQuietly(e.id(), e.all());
      ackUnmapped.accept(e.id());
      closed.add(e.id());
    }
    return new Vacated(chosen, closed);
  }

  /**
   * After the daemon answered a sleep: the segments it names sleep at {@code level} (one whose
   * leases all closed meanwhile is closed); a vacated one it does not name is filled again from
   * itself, since its leases are awake.
   */
  synchronized void slept(Vacated vacated, Collection<Long> sleptIds, int level) {
    Set<Long> slept = new HashSet<>(sleptIds);
    for (MappedSegment e : vacated.segments()) {
      if (!slept.contains(e.id())) {
        e.refillQuietly(fdChannel, sessionId, null);
      } else if (e.leases == 0) {
        unlist(e);
        closeQuietly(e.id(), e.all());
      } else {
        e.sleeping(level);
      }
    }
  }

  /**
   * A refused sleep (nothing changed): each vacated segment is filled again from itself; one that
   * cannot be (an unknown outcome: the daemon let it go) stays vacated, asleep for a wake to
   * bring back, its failure added to {@code refusal}.
   */
  synchronized void sleepRefused(Vacated vacated, int level, GpuMemException refusal) {
    for (MappedSegment e : vacated.segments()) {
      if (!e.refillQuietly(fdChannel, sessionId, refusal)) {
        e.sleeping(level);
      }
    }
  }

  /**
   * Wakes one sleeping segment: the segment {@code to} names is mapped into its ranges, and it
   * is known by that id from now on (with every lease on it). On a failure it stays asleep.
   *
   * @return false when no segment of this process sleeps as {@code oldId} (its leases all closed
   *     meanwhile); the daemon is then told that the new segment is not mapped here
   */
  boolean wake(long oldId, MemoryHandle to) {
    long newId = to.getSegmentId();
    List<SegmentMapping> stale = List.of();
    boolean woken;
    boolean mappedHere;
    synchronized (this) {
      MappedSegment e = entries.get(oldId);
      MappedSegment there = newId == oldId ? null : entries.get(newId);
      woken = e != null && e.asleep();
      if (woken) {
        if (there != null && there.leases > 0) {
          throw ReplyCheck.inconsistent("segment " + Long.toUnsignedString(oldId) + " wakes into segment "
              + Long.toUnsignedString(newId) + ", where this process has awake leases");
        }
        e.refill(to, fdChannel, sessionId);
        if (there != null) { // mapped, no lease on it: the woken range maps that segment now
          unlist(there);
          stale = there.all();
        }
        entries.remove(oldId);
        e.renamed(newId);
        entries.put(newId, e);
        e.sleeping(0);
      }
      mappedHere = entries.containsKey(newId);
    }
    closeQuietly(newId, stale);
    if (!mappedHere) {
      ackUnmapped.accept(newId);
    }
    return woken;
  }

  /** Segments of this process that sleep. */
  synchronized int asleep() {
    return (int) entries.values().stream().filter(MappedSegment::asleep).count();
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
        e.listed = false;
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
    for (MappedSegment e : entries.values()) {
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
      entries.forEach((segmentId, e) -> {
        e.listed = false;
        all.put(segmentId, e.all());
      });
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
