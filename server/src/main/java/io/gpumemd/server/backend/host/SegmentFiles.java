package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.SegmentOwner;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.file.DirectoryStream;
import java.nio.file.FileStore;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The host backend's directory and, with paths, its segment files: which directory ({@link
 * #ownDirectory}), its modes and group, the lock that keeps two daemons apart (shared in
 * descriptor mode once the daemon has cleaned up, so that a take-over's successor can start
 * beside it), the device subdirectories, the clean-up of a dead daemon's files at start and of
 * everything at close; and each path-mode segment file: made, given to its owner, backed with
 * zeros, deleted. {@link HostShmBackend}'s class javadoc says why each is so; the backend keeps
 * the devices and their usage.
 *
 * <p>Thread-safety: files are independent; whether files can be given away is a flag that only
 * ever goes from true to false; {@link #close} is called once, by the backend's synchronized close.
 */
final class SegmentFiles {
  /** The backend's logger: these lines were always the host backend's, and read the same. */
  private static final Logger log = LoggerFactory.getLogger(HostShmBackend.class);
  private static final int ZERO_CHUNK = 1 << 20;
  private static final ByteBuffer ZEROS = ByteBuffer.allocateDirect(ZERO_CHUNK).asReadOnlyBuffer();
  static final Set<PosixFilePermission> OWNED_FILE_MODE = PosixFilePermissions.fromString("rw-------");
  private static final Set<PosixFilePermission> OWNED_GROUP_FILE_MODE = PosixFilePermissions.fromString("rw-rw----");

  private final Path root;
  /** True when this backend created {@link #root}, and so removes it at close. */
  private final boolean createdRoot;
  private final int deviceCount;
  private final Set<PosixFilePermission> fileMode;
  private final GroupPrincipal group;
  private final FileChannel lockChannel;
  private final FileLock lock;
  /** False once a chown was refused: the daemon may not give files away; it stops trying. */
  private final AtomicBoolean canChown = new AtomicBoolean(true);

  /**
   * Creates the device directories and takes the directory lock; removes the segment files a
   * dead daemon left when alone in the directory.
   *
   * @param descriptors segments are memfds passed as descriptors: the lock is shared once clean
   * @throws BackendException when another daemon holds the directory
   * @throws IOException when the directory cannot be used
   */
  SegmentFiles(Path shmDir, int deviceCount, String groupName, boolean descriptors) throws IOException {
    this.root = ownDirectory(shmDir.toAbsolutePath());
    this.deviceCount = deviceCount;
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
    if (taken == null && descriptors) {
      taken = tryLock(lockChannel, true);
    }
    if (taken == null) {
      lockChannel.close();
      throw new BackendException("shm-dir: " + root + " is in use by another gpumemd (expected: a directory of "
          + "this daemon's own" + (!descriptors ? "" : ", or one shared only with daemons in "
          + "--host-segments fd mode") + ")");
    }
    for (int d = 0; d < deviceCount; d++) {
      Path dir = deviceDir(d);
      Files.createDirectories(dir);
      restrict(dir, dirMode);
      int stale = alone ? removeSegmentFiles(dir) : 0;
      if (stale > 0) {
        log.warn("Removed {} segment files left in {} by an earlier daemon", stale, dir);
      }
    }
    if (alone && descriptors) {
      taken.release();
      taken = tryLock(lockChannel, true);
      if (taken == null) {
        lockChannel.close();
        throw new BackendException("shm-dir: " + root + " was taken by a daemon in --host-segments path mode "
            + "while this one started");
      }
    }
    this.lock = taken;
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
      Files.getFileAttributeView(path, PosixFileAttributeView.class).setGroup(group);
    }
  }

  /** Says once when the directory's file system cannot hold {@code wanted} bytes of segments. */
  void warnIfFileSystemTooSmall(long wanted) throws IOException {
    FileStore store = Files.getFileStore(root);
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

  Path root() {
    return root;
  }

  /** The configured group that may also open the files, or null. */
  GroupPrincipal group() {
    return group;
  }

  /**
   * Makes a segment file {@code seg-<n>} of a device, given to its owner when the daemon may
   * chown (else the daemon's, in the configured mode), and backed with zeros. Nothing is left on
   * failure.
   *
   * @throws BackendOutOfMemoryException when the file system is full
   * @throws BackendException when the file cannot be made for another reason
   */
  Path create(int device, long n, long bytes, SegmentOwner owner) {
    Path path = deviceDir(device).resolve("seg-" + n);
    try {
      Files.createFile(path, PosixFilePermissions.asFileAttribute(fileMode));
      if (!giveToOwner(path, owner)) {
        // createFile honours the umask; set the mode (and group) explicitly.
        restrict(path, fileMode);
      }
      back(path, bytes);
      return path;
    } catch (IOException e) {
      delete(path);
      if (isNoSpace(e)) {
        throw new BackendOutOfMemoryException("host device " + device + ": the file system of " + root
            + " has no room for " + bytes + " more bytes (ENOSPC; its size, not --host-device-bytes, is the limit)");
      }
      throw new BackendException("host allocate " + path + " (" + bytes + " bytes): " + e, e);
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

  static boolean isNoSpace(IOException e) {
    return String.valueOf(e.getMessage()).contains("No space left on device");
  }

  static boolean isNoMemory(IOException e) {
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

  /** Deletes a segment file; true if it was there. */
  static boolean delete(Path path) {
    try {
      return Files.deleteIfExists(path);
    } catch (IOException e) {
      log.error("Cannot delete segment file {}: {}", path, e.toString());
      return false;
    }
  }

  /**
   * Releases the directory lock and, when no other daemon shares the directory, removes the
   * segment files, the device directories, the lock file and a root this backend created.
   *
   * @return segment files removed
   */
  int close() {
    int removed = 0;
    try {
      lock.release();
      // Another daemon in descriptor mode still shares the directory (the successor of a
      // take-over): it stays as it is, theirs now.
      FileLock last = tryLock(lockChannel, false);
      if (last == null) {
        log.info("shm-dir {} is shared with another gpumemd (a take-over's successor): left in place", root);
      } else {
        for (int d = 0; d < deviceCount; d++) {
          Path dir = deviceDir(d);
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
    return removed;
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
        if (delete(file)) {
          removed++;
        }
      }
    }
    return removed;
  }
}
