package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.InvalidEventHandleException;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.FileStore;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicBoolean;
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
 * <p>Thread-safe: per-device usage is an atomic counter; files are independent; whether files
 * can be given away is a flag that only ever goes from true to false; the open segments of the
 * descriptor mode are a concurrent set.
 */
public final class HostShmBackend implements MemoryBackend {
  private static final Logger log = LoggerFactory.getLogger(HostShmBackend.class);
  private static final int ZERO_CHUNK = 1 << 20;
  private static final ByteBuffer ZEROS = ByteBuffer.allocateDirect(ZERO_CHUNK).asReadOnlyBuffer();
  static final Set<PosixFilePermission> OWNED_FILE_MODE = PosixFilePermissions.fromString("rw-------");
  private static final Set<PosixFilePermission> OWNED_GROUP_FILE_MODE = PosixFilePermissions.fromString("rw-rw----");

  private final Path root;
  /** True when this backend created {@link #root}, and so removes it at close. */
  private final boolean createdRoot;
  private final List<DeviceInfo> devices;
  private final long capacityBytes;
  private final Set<PosixFilePermission> fileMode;
  private final GroupPrincipal group;
  private final AtomicLongArray usedBytes;
  private final AtomicLong nextFile = new AtomicLong();
  private final FileChannel lockChannel;
  private final FileLock lock;
  /** False once a chown was refused: the daemon may not give files away; it stops trying. */
  private final AtomicBoolean canChown = new AtomicBoolean(true);
  /** The fd channel's socket when segments are passed as descriptors, else null (paths). */
  private final String fdSocket;
  /** Descriptor mode's segments, or null (paths). */
  private final SealedSegments sealed;
  private volatile boolean closed;

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
    if (fdSocket != null) {
      JdkFdNumbers.check();
    }
    this.fdSocket = fdSocket;
    this.sealed = fdSocket == null ? null : new SealedSegments(fdSocket);
    this.capacityBytes = capacityBytes;
    this.usedBytes = new AtomicLongArray(deviceCount);
    try {
      this.root = ownDirectory(shmDir.toAbsolutePath());
      this.createdRoot = !Files.exists(root, LinkOption.NOFOLLOW_LINKS);
      Files.createDirectories(root);
      this.group = groupName == null || groupName.isEmpty()
          ? null
          : root.getFileSystem().getUserPrincipalLookupService().lookupPrincipalByGroupName(groupName);
      this.fileMode = PosixFilePermissions.fromString(group == null ? "rw-------" : "rw-rw----");
      // Others may traverse (not list) the directories: a file given to a tenant's user must be
      // reachable by them; each file's own mode decides who may open it.
      Set<PosixFilePermission> dirMode =
          PosixFilePermissions.fromString(group == null ? "rwx--x--x" : "rwxr-x--x");
      if (createdRoot) {
        restrict(root, dirMode); // never the mode of a directory an operator made
      }
      this.lockChannel = FileChannel.open(root.resolve(".gpumemd.lock"),
          StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
      // Alone in the directory (exclusive lock): files left there are a dead daemon's. In
      // descriptor mode the lock is then shared, so that a successor (--take-over) can start
      // beside this daemon in the same directory: its segments are memfds, on no path.
      FileLock taken = tryLock(lockChannel, false);
      boolean alone = taken != null;
      if (taken == null && fdSocket != null) {
        taken = tryLock(lockChannel, true);
      }
      if (taken == null) {
        lockChannel.close();
        throw new BackendException("shm-dir: " + root + " is in use by another gpumemd (expected: a directory of "
            + "this daemon's own" + (fdSocket == null ? "" : ", or one shared only with daemons in "
            + "--host-segments fd mode") + ")");
      }
      List<DeviceInfo> infos = new ArrayList<>();
      for (int d = 0; d < deviceCount; d++) {
        Path dir = deviceDir(d);
        Files.createDirectories(dir);
        restrict(dir, dirMode);
        int stale = alone ? removeSegmentFiles(dir) : 0;
        if (stale > 0) {
          log.warn("Removed {} segment files left in {} by an earlier daemon", stale, dir);
        }
        UUID uuid = UUID.nameUUIDFromBytes((root + "#" + d).getBytes(StandardCharsets.UTF_8));
        infos.add(new DeviceInfo(d, "host-shm", "HOST-" + uuid, "host", capacityBytes, capacityBytes));
      }
      this.devices = List.copyOf(infos);
      if (alone && fdSocket != null) {
        taken.release();
        taken = tryLock(lockChannel, true);
        if (taken == null) {
          lockChannel.close();
          throw new BackendException("shm-dir: " + root + " was taken by a daemon in --host-segments path mode "
              + "while this one started");
        }
      }
      this.lock = taken;
      if (fdSocket == null) {
        warnIfFileSystemTooSmall(deviceCount);
      } else {
        log.info("Host segments are sealed memfds passed as file descriptors over {}; none is on a path (in {} "
            + "or elsewhere){}", fdSocket, root, group == null ? "" : " (--shm-group plays no part: a descriptor "
            + "is the only way to a segment)");
      }
    } catch (IOException e) {
      throw new BackendException("shm-dir: cannot use " + shmDir.toAbsolutePath() + ": " + e, e);
    }
  }

  /**
   * The directory the segment files go in: {@code shmDir} itself when it does not exist yet
   * (it will be ours) or is this user's own and writable by nobody else; else (a shared
   * directory such as {@code /dev/shm}, mode 1777, or anyone else's) a subdirectory {@code
   * gpumemd} of it, which must in turn be new or this user's own. Anyone who can write to the
   * directory could otherwise plant or swap the files clients map.
   *
   * @throws BackendException when the subdirectory exists and is not this user's own
   */
  static Path ownDirectory(Path shmDir) throws IOException {
    if (!Files.exists(shmDir, LinkOption.NOFOLLOW_LINKS) || isOwnPrivate(shmDir)) {
      return shmDir;
    }
    Path sub = shmDir.resolve("gpumemd");
    if (Files.exists(sub, LinkOption.NOFOLLOW_LINKS) && !isOwnPrivate(sub)) {
      throw new BackendException("shm-dir: " + shmDir + " is shared (or not this daemon's user's), and its "
          + "subdirectory " + sub + " is not this user's own either (owner uid "
          + Files.getAttribute(sub, "unix:uid", LinkOption.NOFOLLOW_LINKS) + ", mode "
          + PosixFilePermissions.toString(Files.getPosixFilePermissions(sub, LinkOption.NOFOLLOW_LINKS))
          + "); expected: a directory of this user that nobody else can write, or none");
    }
    if (!sub.equals(shmDir)) {
      log.info("shm-dir {} is shared or not this user's own: segment files go in {}", shmDir, sub);
    }
    return sub;
  }

  /** A real directory (not a link) of this process's user, writable by nobody else. */
  private static boolean isOwnPrivate(Path dir) throws IOException {
    if (!Files.isDirectory(dir, LinkOption.NOFOLLOW_LINKS)) {
      return false;
    }
    int owner = (Integer) Files.getAttribute(dir, "unix:uid", LinkOption.NOFOLLOW_LINKS);
    int mode = (Integer) Files.getAttribute(dir, "unix:mode", LinkOption.NOFOLLOW_LINKS);
    int self = (Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid");
    return owner == self && (mode & 0022) == 0;
  }

  private void restrict(Path path, Set<PosixFilePermission> mode) throws IOException {
    Files.setPosixFilePermissions(path, mode);
    if (group != null) {
      Files.getFileAttributeView(path, java.nio.file.attribute.PosixFileAttributeView.class)
          .setGroup(group);
    }
  }

  private void warnIfFileSystemTooSmall(int deviceCount) throws IOException {
    FileStore store = Files.getFileStore(root);
    long wanted = capacityBytes * deviceCount;
    if (store.getUsableSpace() < wanted) {
      // Segments are backed when allocated, so a full file system refuses leases
      // (RESOURCE_EXHAUSTED) rather than faulting clients; still, the devices will never reach
      // their configured size. Say so once.
      log.warn("shm-dir {} ({}) has {} bytes free but the host devices may use {}: leases will be "
              + "refused once it fills; lower --host-device-bytes or enlarge the file system",
          root, store.type(), store.getUsableSpace(), wanted);
    }
  }

  private Path deviceDir(int device) {
    return root.resolve("dev" + device);
  }

  /** Directory holding the segment files (for logs and tests). */
  public Path root() {
    return root;
  }

  @Override
  public String name() {
    return "host";
  }

  @Override
  public List<DeviceInfo> devices() {
    return devices;
  }

  @Override
  public SegmentMemory allocate(int device, long bytes, SegmentOwner owner) {
    if (closed) {
      throw new BackendException("host backend is closed");
    }
    long used = usedBytes.addAndGet(device, bytes);
    if (used > capacityBytes) {
      usedBytes.addAndGet(device, -bytes);
      throw new BackendOutOfMemoryException("host device " + device + ": " + bytes
          + " bytes requested, " + (used - bytes) + " of " + capacityBytes + " in use");
    }
    if (fdSocket != null) {
      return allocateSealed(device, bytes);
    }
    Path path = deviceDir(device).resolve("seg-" + nextFile.incrementAndGet());
    try {
      Files.createFile(path, PosixFilePermissions.asFileAttribute(fileMode));
      if (!giveToOwner(path, owner)) {
        // createFile honours the umask; set the mode (and group) explicitly.
        restrict(path, fileMode);
      }
      back(path, bytes);
      return new HostSegment(device, bytes, path);
    } catch (IOException e) {
      usedBytes.addAndGet(device, -bytes);
      deleteQuietly(path);
      if (isNoSpace(e)) {
        throw new BackendOutOfMemoryException("host device " + device + ": the file system of " + root
            + " has no room for " + bytes + " more bytes (ENOSPC; its size, not --host-device-bytes, is the limit)");
      }
      throw new BackendException("host allocate " + path + " (" + bytes + " bytes): " + e, e);
    }
  }

  /** Descriptor mode: a sealed memfd ({@link SealedSegments#allocate}), on no path and no file system of ours. */
  private SegmentMemory allocateSealed(int device, long bytes) {
    String name = Memfds.NAME_PREFIX + device + "-" + nextFile.incrementAndGet();
    try {
      return sealed.allocate(device, bytes, name);
    } catch (IOException | RuntimeException e) {
      usedBytes.addAndGet(device, -bytes);
      if (e instanceof IOException io && (isNoSpace(io) || isNoMemory(io))) {
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

  /**
   * Gives the file its pages now, by writing zeros over all of it. A sparse file would take
   * them when a client first touches each page, and on a full tmpfs that touch is a SIGBUS that
   * kills the client; here a full file system is an allocation failure, which the pool answers
   * with RESOURCE_EXHAUSTED. (Java has no posix_fallocate; writing is what it would do on tmpfs.)
   */
  private static void back(Path path, long bytes) throws IOException {
    try (FileChannel channel = FileChannel.open(path, StandardOpenOption.WRITE)) {
      writeZeros(channel, 0, bytes);
    }
  }

  static void writeZeros(FileChannel channel, long offset, long length) throws IOException {
    long position = offset;
    long end = offset + length;
    while (position < end) {
      ByteBuffer chunk = ZEROS.duplicate();
      chunk.limit((int) Math.min(ZERO_CHUNK, end - position));
      position += channel.write(chunk, position);
    }
  }

  private static boolean isNoSpace(IOException e) {
    return String.valueOf(e.getMessage()).contains("No space left on device");
  }

  private static boolean isNoMemory(IOException e) {
    return String.valueOf(e.getMessage()).contains("Cannot allocate memory");
  }

  /**
   * Gives a new segment file to its owner's user and group, whichever are known, mode 0600
   * (0660 with the group), when the daemon may chown.
   *
   * @return true if the file is now the owner's; false to leave it the daemon's
   */
  private boolean giveToOwner(Path path, SegmentOwner owner) throws IOException {
    if ((owner.uid() < 0 && owner.gid() < 0) || !canChown.get()) {
      return false;
    }
    try {
      // By number: the owner's ids need no name on this host (a container's users, say).
      if (owner.uid() >= 0) {
        Files.setAttribute(path, "unix:uid", owner.uid());
      }
      if (owner.gid() >= 0) {
        Files.setAttribute(path, "unix:gid", owner.gid());
      }
    } catch (FileSystemException e) {
      // Not root (EPERM): every later chown would fail alike. Say so once, not per segment.
      if (canChown.compareAndSet(true, false)) {
        log.warn("Cannot give host segment files to their owners' users ({}): the daemon is not root "
            + "and lacks CAP_CHOWN, so only the daemon's user{} can map host segments", e.getMessage(),
            group == null ? "" : " and group " + group.getName());
      }
      return false;
    }
    Files.setPosixFilePermissions(path, owner.gid() >= 0 ? OWNED_GROUP_FILE_MODE : OWNED_FILE_MODE);
    return true;
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
    if (deleteQuietly(host.path())) {
      usedBytes.addAndGet(host.device(), -host.bytes());
    } else {
      log.warn("Segment file {} was gone before its free; its {} bytes stay counted as in use", host.path(), host.bytes());
    }
  }

  private static boolean deleteQuietly(Path path) {
    try {
      return Files.deleteIfExists(path);
    } catch (IOException e) {
      log.error("Cannot delete segment file {}: {}", path, e.toString());
      return false;
    }
  }

  @Override
  public void zero(SegmentMemory segment, long offset, long length) {
    if (segment instanceof HostFdSegment memfd) {
      try {
        writeZeros(memfd.channel(), offset, length); // within its size: the seals allow it
      } catch (IOException e) {
        throw new BackendException("host zero " + memfd + " [" + offset + ", +" + length + "): " + e, e);
      }
      return;
    }
    HostSegment host = (HostSegment) segment;
    try (FileChannel channel = FileChannel.open(host.path(), StandardOpenOption.WRITE)) {
      // The pages exist since allocate: zeroing cannot run out of space.
      writeZeros(channel, offset, length);
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
    return fdSocket != null ? null : "--host-segments path: segments are files in " + root + ", which a successor "
        + "cannot take over while this daemon holds the directory; restart both daemons with --host-segments fd";
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
    if (closed || device < 0 || device >= devices.size()) {
      SealedSegments.closeReceived(fd);
      throw new BackendException(closed ? "host backend is closed" : "adopt: device " + device + " (expected: 0.."
          + (devices.size() - 1) + ")");
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
  public synchronized void close() {
    if (closed) {
      return;
    }
    closed = true;
    int removed = 0;
    if (sealed != null) {
      for (HostFdSegment segment : sealed.open()) {
        free(segment);
        removed++;
      }
    }
    try {
      lock.release();
      // Another daemon in descriptor mode still shares the directory (the successor of a
      // take-over): it stays as it is, theirs now.
      FileLock last = tryLock(lockChannel, false);
      if (last == null) {
        log.info("shm-dir {} is shared with another gpumemd (a take-over's successor): left in place", root);
      } else {
        for (DeviceInfo device : devices) {
          Path dir = deviceDir(device.ordinal());
          try {
            removed += removeSegmentFiles(dir);
            Files.deleteIfExists(dir);
          } catch (IOException e) {
            log.error("Cannot clean {}: {}", dir, e.toString());
          }
        }
        Files.deleteIfExists(root.resolve(".gpumemd.lock"));
        if (createdRoot) {
          // Ours since start: leave nothing behind (an operator's own directory stays).
          Files.deleteIfExists(root);
        }
        last.release();
      }
      lockChannel.close();
    } catch (IOException e) {
      log.error("Cannot release the lock of {} or remove it: {}", root, e.toString());
    }
    if (removed > 0) {
      log.info("Host backend freed {} segments still present at close", removed);
    }
  }

  /** The directory lock, or null when another process (or this JVM) holds a conflicting one. */
  private static FileLock tryLock(FileChannel channel, boolean shared) throws IOException {
    try {
      return channel.tryLock(0, Long.MAX_VALUE, shared);
    } catch (OverlappingFileLockException e) {
      return null;
    }
  }

  private static int removeSegmentFiles(Path dir) throws IOException {
    if (!Files.isDirectory(dir)) {
      return 0;
    }
    int removed = 0;
    try (DirectoryStream<Path> files = Files.newDirectoryStream(dir, "seg-*")) {
      for (Path file : files) {
        if (deleteQuietly(file)) {
          removed++;
        }
      }
    }
    return removed;
  }
}
