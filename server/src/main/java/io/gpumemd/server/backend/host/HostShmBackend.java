package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.AbstractMemoryBackend;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.InvalidEventHandleException;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@code host} backend: simulated devices whose memory is shared-memory files, so that two
 * processes that lease the same block see the same bytes. Real memory, not a mock.
 *
 * <p>With paths ({@code --host-segments path}), the layout is {@code <shmDir>/dev<N>/seg-<n>}, one
 * file per segment. The client maps the file named by the handle, so the file's owner and mode
 * decide who can map a segment:
 *
 * <ul>
 *   <li>a segment of an owner with a user id ({@link SegmentOwner#uid()}) is given to that user
 *       (and the owner's group, when known) with mode 0600 (0660 with the group); one of an
 *       owner known only by its group ({@link SegmentOwner#gid()}) stays the daemon's user's but
 *       gets that group, mode 0660. So the owner's processes can map it and no other tenant can.
 *       Giving files away needs root (or {@code CAP_CHOWN}); a daemon that cannot keeps the
 *       files its own, as below, and says once that other users cannot map host segments;
 *   <li>any other segment stays the daemon's, mode 0600 (0660 with a configured group), so only
 *       the daemon's user (and that group) can open it.
 * </ul>
 *
 * <p>Such a file cannot be sealed (only {@code memfd_create} makes files that take seals), so
 * whoever may open it read-write (the owner's processes) may also resize it: shrinking it faults
 * only the processes that map it, all of the owner's tenant (a segment never changes tenant);
 * growing it takes room in the directory's file system that no budget counts, until the daemon
 * removes the file when it frees the segment. Descriptor mode (below) has neither.
 *
 * <p>Segments are backed (written with zeros) when allocated, not sparse: a file system (or, for
 * memfds, memory) that fills up refuses the allocation ({@link BackendOutOfMemoryException},
 * RESOURCE_EXHAUSTED at Lease) instead of faulting a client with SIGBUS when it first touches a
 * page.
 *
 * <p>The directories are mode 0711 (0751 with a configured group): anyone may pass through to a
 * file given to them, nobody else may list the segments. A lock file in {@code shmDir} keeps
 * two daemons from sharing a directory; files left by a daemon that crashed are removed at
 * start. In descriptor mode (below) the lock is shared once the daemon has cleaned up, so that
 * a successor ({@code gpumemd --take-over}) can start in the same directory while its
 * predecessor still runs; only the last daemon to leave removes the directories.
 *
 * <p>With descriptors ({@code --host-segments fd}, {@link #HostShmBackend(Path, int, long, String,
 * String)}) no segment lives on a path: each is a memfd (the daemon's, mode 0600), backed, then
 * sealed against growing and shrinking before any descriptor of it leaves the daemon ({@link
 * SealedSegments}); the daemon keeps the open file ({@link HostFdSegment}) and the fd channel
 * hands clients descriptors of it. A daemon killed with SIGKILL leaves no segment file, a
 * client's mapping outlives the daemon, no client can resize a segment, and nobody without a
 * descriptor can map one: file owners and modes, and {@code --shm-group}, play no part. The
 * directory is still taken (its lock is what a successor's take-over shares) but holds no
 * segment; memfds take their pages from the kernel's own tmpfs, bounded by memory, not by the
 * size of the directory's file system.
 *
 * <p>Each device has a configured capacity enforced here: an allocation beyond it fails with
 * {@link BackendOutOfMemoryException}, as {@code cuMemAlloc} would on a full GPU.
 *
 * <p>This class keeps the devices and their usage and answers the backend's calls; the directory,
 * its lock and the path-mode segment files are {@link SegmentFiles}', the descriptor mode's memfds
 * {@link SealedSegments}'.
 *
 * <p>Thread-safe: per-device usage is an atomic counter; files are independent; whether files
 * can be given away is a flag that only ever goes from true to false; the open segments of the
 * descriptor mode are a concurrent set.
 */
public final class HostShmBackend extends AbstractMemoryBackend {
  private static final Logger log = LoggerFactory.getLogger(HostShmBackend.class);

  private final SegmentFiles files;
  private final long capacityBytes;
  private final AtomicLongArray usedBytes;
  private final AtomicLong nextFile = new AtomicLong();
  /** The fd channel's socket when segments are passed as descriptors, else null (paths). */
  private final String fdSocket;
  /** Descriptor mode's segments, or null (paths). */
  private final SealedSegments sealed;

  /**
   * Creates the device directories and takes the directory lock.
   *
   * @param shmDir directory for the segment files (created if missing; tmpfs recommended)
   * @param deviceCount number of simulated devices
   * @param capacityBytes capacity of each device
   * @param groupName group that may also open the files, or {@code null} for owner only
   * @throws BackendException when the directory cannot be used or another daemon holds it
   */
  public HostShmBackend(Path shmDir, int deviceCount, long capacityBytes, String groupName) {
    this(shmDir, deviceCount, capacityBytes, groupName, null);
  }

  /**
   * Creates the device directories and takes the directory lock.
   *
   * @param fdSocket null for segments that clients map by path; else segments are passed as
   *     descriptors by the fd channel listening there (named in each handle)
   * @throws BackendException when the directory cannot be used or another daemon holds it, or
   *     (descriptors) when this JVM does not show descriptor numbers
   */
  public HostShmBackend(Path shmDir, int deviceCount, long capacityBytes, String groupName, String fdSocket) {
    this(shmDir, openFiles(shmDir, deviceCount, groupName, fdSocket), deviceCount, capacityBytes, fdSocket, false);
  }

  /**
   * Scratch memory for a take-over rehearsal: one device of {@code capacityBytes} whose segments
   * are sealed memfds of this process, in a directory of its own ({@code dir}, removed at close
   * when this made it), apart from every device this daemon serves and from their budgets.
   * Quiet: a rehearsal logs nothing an operator would read.
   */
  public static HostShmBackend scratch(Path dir, long capacityBytes) {
    String fdSocket = "rehearsal"; // descriptor mode; its segments go to no client, so the socket is a name only
    return new HostShmBackend(dir, openFiles(dir, 1, null, fdSocket), 1, capacityBytes, fdSocket, true);
  }

  private HostShmBackend(Path shmDir, SegmentFiles files, int deviceCount, long capacityBytes, String fdSocket,
      boolean quiet) {
    super("host", simulatedDevices(files.root(), deviceCount, capacityBytes));
    this.files = files;
    this.fdSocket = fdSocket;
    this.sealed = fdSocket == null ? null : new SealedSegments(fdSocket);
    this.capacityBytes = capacityBytes;
    this.usedBytes = new AtomicLongArray(deviceCount);
    if (fdSocket == null) {
      try {
        files.warnIfFileSystemTooSmall(capacityBytes * deviceCount);
      } catch (IOException e) {
        throw cannotUse(shmDir, e);
      }
    } else if (!quiet) {
      log.info("Host segments are sealed memfds passed as file descriptors over {}; none is on a path (in {} "
          + "or elsewhere){}", fdSocket, files.root(), files.group() == null ? "" : " (--shm-group plays no "
          + "part: a descriptor is the only way to a segment)");
    }
  }

  /** The segment directory, checked and locked (and, for descriptors, the JVM checked first). */
  private static SegmentFiles openFiles(Path shmDir, int deviceCount, String groupName, String fdSocket) {
    if (fdSocket != null) {
      JdkFdNumbers.check();
    }
    try {
      return new SegmentFiles(shmDir, deviceCount, groupName, fdSocket != null);
    } catch (IOException e) {
      throw cannotUse(shmDir, e);
    }
  }

  private static BackendException cannotUse(Path shmDir, IOException e) {
    return new BackendException("shm-dir: cannot use " + shmDir.toAbsolutePath() + ": " + e, e);
  }

  /** The simulated devices, each named by a UUID of the directory and its ordinal. */
  private static List<DeviceInfo> simulatedDevices(Path root, int deviceCount, long capacityBytes) {
    List<DeviceInfo> infos = new ArrayList<>();
    for (int d = 0; d < deviceCount; d++) {
      UUID uuid = UUID.nameUUIDFromBytes((root + "#" + d).getBytes(StandardCharsets.UTF_8));
      infos.add(new DeviceInfo(d, "host-shm", "HOST-" + uuid, "host", capacityBytes, capacityBytes));
    }
    return infos;
  }

  /** Directory holding the segment files (for logs and tests). */
  public Path root() {
    return files.root();
  }

  @Override
  public SegmentMemory allocate(int device, long bytes, SegmentOwner owner) {
    checkOpen();
    long used = usedBytes.addAndGet(device, bytes);
    if (used > capacityBytes) {
      usedBytes.addAndGet(device, -bytes);
      throw new BackendOutOfMemoryException("host device " + device + ": " + bytes
          + " bytes requested, " + (used - bytes) + " of " + capacityBytes + " in use");
    }
    if (fdSocket != null) {
      return allocateSealed(device, bytes);
    }
    try {
      return new HostSegment(device, bytes, files.create(device, nextFile.incrementAndGet(), bytes, owner));
    } catch (RuntimeException e) {
      usedBytes.addAndGet(device, -bytes);
      throw e;
    }
  }

  /** Descriptor mode: a sealed memfd ({@link SealedSegments#allocate}), on no path and no file system of ours. */
  private SegmentMemory allocateSealed(int device, long bytes) {
    String name = Memfds.NAME_PREFIX + device + "-" + nextFile.incrementAndGet();
    try {
      return sealed.allocate(device, bytes, name);
    } catch (IOException | RuntimeException e) {
      usedBytes.addAndGet(device, -bytes);
      if (e instanceof IOException io && (SegmentFiles.isNoSpace(io) || SegmentFiles.isNoMemory(io))) {
        // A memfd's pages come from the kernel's own tmpfs, bounded by memory (and the daemon's
        // memory cgroup), not by the size of shm-dir.
        throw new BackendOutOfMemoryException("host device " + device + ": no memory for " + bytes
            + " more bytes (memfd " + name + ": " + io.getMessage() + "; host memory, not --host-device-bytes, is the "
            + "limit)");
      }
      throw e instanceof BackendException b ? b
          : new BackendException("host allocate memfd " + name + " (" + bytes + " bytes): " + e, e);
    }
  }

  @Override
  public void free(SegmentMemory segment) {
    if (segment instanceof HostFdSegment fd) {
      if (sealed.free(fd)) {
        usedBytes.addAndGet(fd.device(), -fd.bytes());
      }
      return;
    }
    HostSegment host = (HostSegment) segment;
    if (SegmentFiles.delete(host.path())) {
      usedBytes.addAndGet(host.device(), -host.bytes());
    } else {
      log.warn("Segment file {} was gone before its free; its {} bytes stay counted as in use", host.path(), host.bytes());
    }
  }

  @Override
  public void zero(SegmentMemory segment, long offset, long length) {
    if (segment instanceof HostFdSegment memfd) {
      try {
        SegmentFiles.writeZeros(memfd.channel(), offset, length); // within its size: the seals allow it
      } catch (IOException e) {
        throw new BackendException("host zero " + memfd + " [" + offset + ", +" + length + "): " + e, e);
      }
      return;
    }
    HostSegment host = (HostSegment) segment;
    try (FileChannel channel = FileChannel.open(host.path(), StandardOpenOption.WRITE)) {
      // The pages exist since allocate: zeroing cannot run out of space.
      SegmentFiles.writeZeros(channel, offset, length);
    } catch (IOException e) {
      throw new BackendException("host zero " + host.path() + " [" + offset + ", +" + length + "): " + e, e);
    }
  }

  @Override
  public HostBuffer allocateHost(long bytes) {
    return HostCopies.allocate(bytes);
  }

  @Override
  public void copyToHost(SegmentMemory segment, long offset, HostBuffer host, long hostOffset, long length) {
    HostCopies.toHost(segment, offset, host, hostOffset, length);
  }

  @Override
  public void copyFromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    HostCopies.fromHost(host, hostOffset, segment, offset, length);
  }

  @Override
  public boolean freshSegmentsAreZeroed() {
    return true; // a new file reads as zeros
  }

  @Override
  public boolean supportsCompletionEvents() {
    return false;
  }

  @Override
  public CompletionEvent openEvent(int device, byte[] ipcEventHandle) {
    throw new InvalidEventHandleException(ipcEventHandle.length + " bytes",
        "empty: host device " + device + " has no CUDA events");
  }

  /**
   * Null in descriptor mode: a segment is a memfd, which lives on in a successor that
   * was sent a descriptor of it. With paths, a successor would have to share this daemon's
   * directory, which its lock and its clean-up at start forbid.
   */
  @Override
  public String takeOverRefusal() {
    return fdSocket != null ? null : "--host-segments path: segments are files in " + files.root() + ", which a "
        + "successor cannot take over while this daemon holds the directory; restart both daemons with "
        + "--host-segments fd";
  }

  /**
   * Adopts a sealed segment memfd from a descriptor ({@link SealedSegments#adopt}); its bytes
   * count against the device's capacity like a new segment's.
   */
  @Override
  public SegmentMemory adopt(int device, int fd, long bytes) {
    if (fdSocket == null) {
      SealedSegments.closeReceived(fd);
      throw new UnsupportedOperationException(takeOverRefusal());
    }
    if (isClosed() || device < 0 || device >= devices().size()) {
      SealedSegments.closeReceived(fd);
      checkOpen();
      throw new BackendException("adopt: device " + device + " (expected: 0.." + (devices().size() - 1) + ")");
    }
    long used = usedBytes.addAndGet(device, bytes);
    if (used > capacityBytes) {
      usedBytes.addAndGet(device, -bytes);
      SealedSegments.closeReceived(fd);
      throw new BackendOutOfMemoryException("host device " + device + ": cannot adopt a " + bytes
          + "-byte segment, " + (used - bytes) + " of " + capacityBytes + " in use (--host-device-bytes)");
    }
    try {
      return sealed.adopt(device, fd, bytes);
    } catch (IOException | RuntimeException e) {
      usedBytes.addAndGet(device, -bytes);
      throw e instanceof BackendException b ? b
          : new BackendException("host adopt of descriptor " + fd + " (" + bytes + " bytes): " + e, e);
    }
  }

  /**
   * Closes the daemon's descriptor of a segment memfd, as {@link #free} does: the memfd lives
   * on while the successor's descriptor (or a client's mapping) holds it.
   */
  @Override
  public void relinquish(SegmentMemory segment) {
    if (!(segment instanceof HostFdSegment fd)) {
      throw new UnsupportedOperationException(takeOverRefusal());
    }
    free(fd);
  }

  @Override
  public boolean passesDescriptors() {
    return fdSocket != null;
  }

  @Override
  protected void release() {
    int removed = 0;
    if (sealed != null) {
      for (HostFdSegment segment : sealed.open()) {
        free(segment);
        removed++;
      }
    }
    removed += files.close();
    if (removed > 0) {
      log.info("Host backend freed {} segments still present at close", removed);
    }
  }
}
