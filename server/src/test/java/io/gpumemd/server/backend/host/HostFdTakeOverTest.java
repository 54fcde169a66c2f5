package io.gpumemd.server.backend.host;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.pool.DescriptorPassing;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The host backend's half of the take-over in descriptor mode: adopting a segment from a
 * descriptor passed over a real Unix socket (and refusing what is not one), relinquishing one
 * without destroying it, the refusal of path mode, and a directory shared with another daemon
 * (a real process holding the shared lock, as a predecessor does).
 */
class HostFdTakeOverTest {
  private static final long MiB = 1024 * 1024;
  private static final String FD_SOCKET = "/run/gpumemd/gpumemd.sock.fd";

  @TempDir
  Path tmp;

  private final List<AutoCloseable> cleanup = new ArrayList<>();

  @AfterEach
  void closeAll() throws Exception {
    for (int i = cleanup.size() - 1; i >= 0; i--) {
      cleanup.get(i).close();
    }
  }

  private HostShmBackend fdBackend(String dir, long capacity) {
    HostShmBackend backend = new HostShmBackend(tmp.resolve(dir), 1, capacity, null, FD_SOCKET);
    cleanup.add(backend);
    return backend;
  }

  /** Passes a read-write descriptor of the segment through a Unix socket; the received number. */
  private int pass(SegmentMemory segment, String name) throws Exception {
    DescriptorPassing passing = new DescriptorPassing(tmp.resolve(name + ".sock"));
    cleanup.add(passing);
    passing.add(((FdPassedSegment) segment).open(false));
    return passing.received()[0];
  }

  private static boolean isOpen(int fd) {
    return Files.exists(Path.of("/proc/self/fd/" + fd));
  }

  private static void write(SegmentMemory segment, byte[] bytes) throws Exception {
    ((HostFdSegment) segment).channel().write(ByteBuffer.wrap(bytes), 0);
  }

  private static byte[] read(SegmentMemory segment, int length) throws Exception {
    ByteBuffer buffer = ByteBuffer.allocate(length);
    ((HostFdSegment) segment).channel().read(buffer, 0);
    return buffer.array();
  }

  @Test
  void adopted_segment_hasTheBytes_andOutlivesTheRelinquishedOriginal() throws Exception {
    HostShmBackend holder = fdBackend("old", 16 * MiB);
    HostShmBackend taker = fdBackend("new", 16 * MiB);
    SegmentMemory original = holder.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    byte[] bytes = "kept across the take-over".getBytes(StandardCharsets.UTF_8);
    write(original, bytes);
    int fd = pass(original, "a");

    SegmentMemory adopted = taker.adopt(0, fd, 2 * MiB);
    assertFalse(isOpen(fd) && fd != ((HostFdSegment) adopted).number(), "the received number is closed");
    int holderNumber = ((HostFdSegment) original).number();
    holder.relinquish(original);

    assertFalse(isOpen(holderNumber) && holderNumber != ((HostFdSegment) adopted).number(),
        "the holder's descriptor is closed");
    assertNull(((FdPassedSegment) original).open(false), "the holder hands out no more descriptors");
    assertArrayEquals(bytes, read(adopted, bytes.length));
    assertEquals(2 * MiB, adopted.bytes());
    // It is the taker's segment like one of its own: it counts, and it frees.
    assertThrows(BackendOutOfMemoryException.class, () -> taker.allocate(0, 15 * MiB, SegmentOwner.DAEMON));
    taker.free(adopted);
    taker.free(taker.allocate(0, 15 * MiB, SegmentOwner.DAEMON));
  }

  @Test
  void adopt_ofTheWrongSize_isRefused_andClosesTheDescriptor() throws Exception {
    HostShmBackend holder = fdBackend("old", 16 * MiB);
    HostShmBackend taker = fdBackend("new", 16 * MiB);
    int fd = pass(holder.allocate(0, 2 * MiB, SegmentOwner.DAEMON), "b");
    String target = Files.readSymbolicLink(Path.of("/proc/self/fd/" + fd)).toString();

    BackendException e = assertThrows(BackendException.class, () -> taker.adopt(0, fd, 4 * MiB));
    assertTrue(e.getMessage().contains("expected: 4194304"), e.getMessage());
    assertTrue(!isOpen(fd) || !Files.readSymbolicLink(Path.of("/proc/self/fd/" + fd)).toString().equals(target),
        "the received descriptor is closed");
    // Its bytes did not count: the whole capacity is still there.
    taker.free(taker.allocate(0, 16 * MiB, SegmentOwner.DAEMON));
  }

  @Test
  void adopt_ofAFileOnAPath_isRefused() throws Exception {
    HostShmBackend taker = fdBackend("new", 16 * MiB);
    Path file = tmp.resolve("not-a-segment");
    Files.write(file, new byte[(int) MiB]);
    RandomAccessFile open = new RandomAccessFile(file.toFile(), "rw");
    cleanup.add(open);
    // A second, raw number of it, as a received one would be.
    DescriptorPassing passing = new DescriptorPassing(tmp.resolve("c.sock"));
    cleanup.add(passing);
    passing.add(new SegmentFd(open, JdkFdNumbers.of(open.getFD()), false));
    int fd = passing.received()[0];

    BackendException e = assertThrows(BackendException.class, () -> taker.adopt(0, fd, MiB));
    assertTrue(e.getMessage().contains("names " + file + " (expected: a memfd named gpumemd-seg-"), e.getMessage());
  }

  // ------------------------------------------------------------------ only sealed segments

  /** A memfd made by hand, named as a segment, of {@code bytes}, sealed or not; passed as a predecessor would. */
  private int handMadeMemfd(String name, long bytes, boolean sealed) throws Exception {
    int raw = Memfds.create(Memfds.NAME_PREFIX + name);
    try (RandomAccessFile file = new RandomAccessFile("/proc/self/fd/" + raw, "rw")) {
      file.setLength(bytes);
    }
    if (sealed) {
      Memfds.seal(raw);
    }
    DescriptorPassing passing = new DescriptorPassing(tmp.resolve(name + ".sock"));
    cleanup.add(passing);
    passing.add(SegmentFd.ofNative(raw, false)); // sends it, then closes our number
    return passing.received()[0];
  }

  @Test
  void adopt_ofAnUnsealedMemfd_isRefused_andItsBytesDoNotCount() throws Exception {
    HostShmBackend taker = fdBackend("new", 16 * MiB);
    int fd = handMadeMemfd("0-1", 2 * MiB, false);
    String seals = Memfds.describe(Memfds.seals(fd)); // none, or F_SEAL_EXEC on Linux 6.3+

    BackendException e = assertThrows(BackendException.class, () -> taker.adopt(0, fd, 2 * MiB));
    assertTrue(e.getMessage().contains("descriptor " + fd + " (/memfd:gpumemd-seg-0-1 (deleted)) has seals " + seals
        + " (expected: F_SEAL_GROW and F_SEAL_SHRINK"), e.getMessage());
    taker.free(taker.allocate(0, 16 * MiB, SegmentOwner.DAEMON));
  }

  @Test
  void adopt_ofAnUnlinkedTmpfsFile_isRefused() throws Exception {
    HostShmBackend taker = fdBackend("new", 16 * MiB);
    // What a daemon before sealed memfds handed over: a removed file on tmpfs, unsealable.
    assumeTrue(Files.isDirectory(Path.of("/dev/shm")) && "tmpfs".equals(Files.getFileStore(Path.of("/dev/shm")).type()),
        "needs a tmpfs at /dev/shm");
    Path file = Files.createTempFile(Path.of("/dev/shm"), "gpumemd-seg-", "");
    RandomAccessFile open = new RandomAccessFile(file.toFile(), "rw");
    cleanup.add(open);
    open.setLength(2 * MiB);
    Files.delete(file);
    DescriptorPassing passing = new DescriptorPassing(tmp.resolve("tmpfs.sock"));
    cleanup.add(passing);
    passing.add(new SegmentFd(open, JdkFdNumbers.of(open.getFD()), false));
    int fd = passing.received()[0];

    BackendException e = assertThrows(BackendException.class, () -> taker.adopt(0, fd, 2 * MiB));
    assertTrue(e.getMessage().contains("names " + file + " (deleted) (expected: a memfd named gpumemd-seg-"),
        e.getMessage());
  }

  @Test
  void adopt_ofASealedMemfd_takesItAtTheStatedSizeOnly() throws Exception {
    HostShmBackend taker = fdBackend("new", 16 * MiB);
    int wrongSize = handMadeMemfd("0-2", MiB, true);
    int rightSize = handMadeMemfd("0-3", 2 * MiB, true);

    BackendException e = assertThrows(BackendException.class, () -> taker.adopt(0, wrongSize, 2 * MiB));
    assertTrue(e.getMessage().contains(MiB + " bytes (expected: " + 2 * MiB), e.getMessage());
    SegmentMemory adopted = taker.adopt(0, rightSize, 2 * MiB);
    try (SegmentFd descriptor = ((FdPassedSegment) adopted).open(false)) {
      int seals = Memfds.seals(descriptor.number());
      assertEquals(Memfds.SEGMENT_SEALS, seals & Memfds.SEGMENT_SEALS, Memfds.describe(seals));
    }
    assertEquals(2 * MiB, adopted.bytes());
    taker.free(adopted);
  }

  @Test
  void adopt_overTheCapacity_isOutOfMemory() throws Exception {
    HostShmBackend holder = fdBackend("old", 16 * MiB);
    HostShmBackend taker = fdBackend("new", 2 * MiB);
    taker.free(taker.allocate(0, 2 * MiB, SegmentOwner.DAEMON));
    SegmentMemory kept = taker.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    int fd = pass(holder.allocate(0, 2 * MiB, SegmentOwner.DAEMON), "d");

    BackendOutOfMemoryException e = assertThrows(BackendOutOfMemoryException.class, () -> taker.adopt(0, fd, 2 * MiB));
    assertTrue(e.getMessage().contains("--host-device-bytes"), e.getMessage());
    taker.free(kept);
  }

  @Test
  void pathMode_refusesTakeOvers_namingFdMode() {
    HostShmBackend paths = new HostShmBackend(tmp.resolve("paths"), 1, 16 * MiB, null);
    cleanup.add(paths);

    assertTrue(paths.takeOverRefusal().contains("--host-segments fd"), paths.takeOverRefusal());
    assertNull(fdBackend("fd", 16 * MiB).takeOverRefusal());
    SegmentMemory segment = paths.allocate(0, MiB, SegmentOwner.DAEMON);
    assertThrows(UnsupportedOperationException.class, () -> paths.relinquish(segment));
  }

  // ---------------------------------------------------------------------------- a shared directory

  /** Another process holding the directory's lock shared, as a daemon in descriptor mode does. */
  private Process sharedLockHolder(Path lockFile) throws Exception {
    Process p = new ProcessBuilder("/usr/bin/python3", "-c",
        "import fcntl,sys\nf=open(sys.argv[1],'r+')\nfcntl.lockf(f,fcntl.LOCK_SH)\nprint('locked',flush=True)\n"
            + "sys.stdin.read()", lockFile.toString())
        .redirectErrorStream(true).start();
    cleanup.add(() -> {
      p.getOutputStream().close();
      p.waitFor();
    });
    BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
    assertEquals("locked", out.readLine());
    return p;
  }

  @Test
  void fdMode_sharesTheDirectoryWithALiveDaemon_leavesItsFiles_andLeavesTheDirectoryToIt() throws Exception {
    Path root = tmp.resolve("shared");
    Files.createDirectory(root, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
    Path lockFile = Files.createFile(root.resolve(".gpumemd.lock"));
    Path othersFile = Files.createDirectories(root.resolve("dev0")).resolve("seg-999-1");
    Files.write(othersFile, new byte[] {1});
    Process other = sharedLockHolder(lockFile);

    HostShmBackend paths = null;
    BackendException refused = assertThrows(BackendException.class,
        () -> new HostShmBackend(root, 1, 16 * MiB, null));
    assertTrue(refused.getMessage().contains("in use by another gpumemd"), refused.getMessage());
    HostShmBackend fd = new HostShmBackend(root, 1, 16 * MiB, null, FD_SOCKET);
    assertTrue(Files.exists(othersFile), "a file the other daemon may be creating is not removed");
    fd.free(fd.allocate(0, 2 * MiB, SegmentOwner.DAEMON));
    fd.close();
    assertTrue(Files.exists(root.resolve("dev0")) && Files.exists(lockFile), "the other daemon's directory stays");

    other.getOutputStream().close();
    other.waitFor();
    try (Stream<Path> before = Files.list(root.resolve("dev0"))) {
      assertEquals(1, before.count());
    }
    HostShmBackend alone = new HostShmBackend(root, 1, 16 * MiB, null, FD_SOCKET);
    cleanup.add(alone);
    assertFalse(Files.exists(othersFile), "alone, it removes what a dead daemon left");
  }
}
