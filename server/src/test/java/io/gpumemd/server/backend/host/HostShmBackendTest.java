package io.gpumemd.server.backend.host;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.MemoryBackendContractTest;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The {@link MemoryBackendContractTest} on the host backend, reading and writing segments
 * through their files as a client would, plus what is particular to it: file modes, files given
 * to their owners' users (checked by really opening them as another user), files gone on free
 * and at close, stale files removed at start, one daemon per directory, the configured capacity.
 */
class HostShmBackendTest extends MemoryBackendContractTest {
  private static final long CAPACITY = 64 * MiB;

  @TempDir
  Path tmp;

  private Path shmDir() {
    return tmp.resolve("shm");
  }

  @Override
  protected MemoryBackend createBackend() {
    return new HostShmBackend(shmDir(), 2, CAPACITY, null);
  }

  private HostShmBackend host() {
    return (HostShmBackend) backend;
  }

  private static Path path(SegmentMemory segment) {
    return Path.of(((IpcHandle.HostShm) segment.handle()).path());
  }

  @Override
  protected byte[] read(SegmentMemory segment, long offset, int length) throws Exception {
    try (FileChannel channel = FileChannel.open(path(segment), StandardOpenOption.READ)) {
      ByteBuffer buffer = ByteBuffer.allocate(length);
      while (buffer.hasRemaining()) {
        if (channel.read(buffer, offset + buffer.position()) < 0) {
          throw new AssertionError("segment file shorter than " + (offset + length));
        }
      }
      return buffer.array();
    }
  }

  @Override
  protected void write(SegmentMemory segment, long offset, byte[] bytes) throws Exception {
    try (FileChannel channel = FileChannel.open(path(segment), StandardOpenOption.WRITE)) {
      ByteBuffer buffer = ByteBuffer.wrap(bytes);
      while (buffer.hasRemaining()) {
        channel.write(buffer, offset + buffer.position());
      }
    }
  }

  @Override
  protected void assertReleased(List<SegmentMemory> segments) {
    for (SegmentMemory segment : segments) {
      assertFalse(Files.exists(path(segment)), "file of a freed segment still exists: " + path(segment));
    }
  }

  private List<Path> segmentFiles(int device) throws Exception {
    Path dir = shmDir().resolve("dev" + device);
    if (!Files.isDirectory(dir)) {
      return List.of();
    }
    try (Stream<Path> files = Files.list(dir)) {
      return files.filter(p -> p.getFileName().toString().startsWith("seg-")).toList();
    }
  }

  // ---------------------------------------------------------------------------- host only

  @Test
  void segment_isAFileOfTheSegmentsSizeWithMode0600() throws Exception {
    SegmentMemory segment = allocate(1, 4 * MiB);

    Path file = path(segment);
    assertTrue(file.startsWith(shmDir().resolve("dev1")), file.toString());
    assertEquals(4 * MiB, Files.size(file));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    // Others may pass through to a file given to them, not list the directory.
    assertEquals("rwx--x--x", PosixFilePermissions.toString(Files.getPosixFilePermissions(shmDir())));
    assertEquals("rwx--x--x", PosixFilePermissions.toString(Files.getPosixFilePermissions(file.getParent())));
  }

  // ------------------------------------------------------------------------ owners' files

  private static final int NOBODY = 65534;

  /** Runs as root with a tmp directory that other users may traverse (JUnit makes it 0700). */
  private void assumeRootAndTraversableTmp() throws Exception {
    assumeTrue((int) Files.getAttribute(tmp, "unix:uid") == 0,
        "giving files to other users needs root; run the tests as root to check it");
    Files.setPosixFilePermissions(tmp, PosixFilePermissions.fromString("rwx--x--x"));
  }

  private static int uidOf(Path file) throws Exception {
    return (int) Files.getAttribute(file, "unix:uid");
  }

  private static int gidOf(Path file) throws Exception {
    return (int) Files.getAttribute(file, "unix:gid");
  }

  /** Reads one byte of a file in a real process of another user; returns its exit code and output. */
  private static String readAs(int uid, int gid, Path file) throws Exception {
    Process p = new ProcessBuilder("setpriv", "--reuid=" + uid, "--regid=" + gid, "--clear-groups",
        "dd", "if=" + file, "of=/dev/null", "bs=1", "count=1", "status=none").redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(30, TimeUnit.SECONDS), "dd did not end: " + out);
    return ("exit=" + p.exitValue() + " " + out).trim();
  }

  @Test
  void segment_ofAnOwnerWithUidAndGid_isTheirs_mode0660_andTheirProcessCanOpenIt() throws Exception {
    assumeRootAndTraversableTmp();

    SegmentMemory segment = allocate(0, 2 * MiB, new SegmentOwner("uid:65534", NOBODY, NOBODY));

    Path file = path(segment);
    assertEquals(NOBODY, uidOf(file));
    assertEquals(NOBODY, gidOf(file));
    assertEquals("rw-rw----", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    assertEquals("exit=0", readAs(NOBODY, NOBODY, file));
    // Another tenant (neither the user nor in the group) cannot.
    assertTrue(readAs(1234, 1234, file).contains("Permission denied"), readAs(1234, 1234, file));
    // The daemon still zeroes, sizes and frees it.
    backend.zero(segment, 0, 2 * MiB);
    backend.free(segment);
    assertFalse(Files.exists(file));
  }

  @Test
  void segment_ofAnOwnerWithUidOnly_isTheirs_mode0600() throws Exception {
    assumeRootAndTraversableTmp();

    SegmentMemory segment = allocate(0, 2 * MiB, new SegmentOwner("uid:65534", NOBODY, -1));

    Path file = path(segment);
    assertEquals(NOBODY, uidOf(file));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    assertEquals(2 * MiB, Files.size(file));
    assertEquals("exit=0", readAs(NOBODY, NOBODY, file));
  }

  @Test
  void segment_ofAnOwnerWithGidOnly_getsTheirGroup_mode0660() throws Exception {
    assumeRootAndTraversableTmp();

    SegmentMemory segment = allocate(0, 2 * MiB, new SegmentOwner("gid:65534", -1, NOBODY));

    Path file = path(segment);
    assertEquals(0, uidOf(file), "the user stays the daemon's");
    assertEquals(NOBODY, gidOf(file));
    assertEquals("rw-rw----", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    assertEquals("exit=0", readAs(1234, NOBODY, file), "any user of the group may map it");
    String refused = readAs(1234, 1234, file);
    assertTrue(refused.contains("Permission denied"), refused);
  }

  @Test
  void segment_ofTheDaemon_cannotBeOpenedByAnotherUser() throws Exception {
    assumeRootAndTraversableTmp();
    // The owner's file is reachable through the same directories: what refuses is the file.
    Path owned = path(allocate(0, 2 * MiB, new SegmentOwner("uid:65534", NOBODY, NOBODY)));
    assertEquals("exit=0", readAs(NOBODY, NOBODY, owned));

    SegmentMemory segment = allocate(0, 2 * MiB, SegmentOwner.DAEMON);

    Path file = path(segment);
    assertEquals(0, uidOf(file));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    String refused = readAs(NOBODY, NOBODY, file);
    assertTrue(refused.startsWith("exit=1") && refused.contains("Permission denied"), refused);
  }

  @Test
  void segment_ofAnOwnerKnownOnlyByKey_staysTheDaemons() throws Exception {
    assumeRootAndTraversableTmp();

    Path file = path(allocate(0, 2 * MiB, SegmentOwner.of("session-1")));

    assertEquals(0, uidOf(file));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
  }

  @Test
  void segment_withAConfiguredGroup_isAlsoReadableAndWritableByIt() throws Exception {
    backend.close();
    Files.createDirectories(tmp.resolve("grouped"));
    GroupPrincipal group = Files.readAttributes(tmp, java.nio.file.attribute.PosixFileAttributes.class).group();
    backend = new HostShmBackend(tmp.resolve("grouped"), 1, CAPACITY, group.getName());

    SegmentMemory segment = allocate(0, 2 * MiB);

    assertEquals("rw-rw----", PosixFilePermissions.toString(Files.getPosixFilePermissions(path(segment))));
    assertEquals(group, Files.readAttributes(path(segment), java.nio.file.attribute.PosixFileAttributes.class).group());
    assertEquals("rwxr-x--x", PosixFilePermissions.toString(Files.getPosixFilePermissions(path(segment).getParent())));
  }

  @Test
  void free_removesTheFile() throws Exception {
    SegmentMemory segment = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    assertTrue(Files.exists(path(segment)));

    backend.free(segment);

    assertFalse(Files.exists(path(segment)));
    assertEquals(List.of(), segmentFiles(0));
  }

  @Test
  void close_removesEveryFileAndTheLock() throws Exception {
    allocate(0, 2 * MiB);
    allocate(1, 2 * MiB);

    backend.close();

    assertEquals(List.of(), segmentFiles(0));
    assertEquals(List.of(), segmentFiles(1));
    assertFalse(Files.exists(shmDir().resolve(".gpumemd.lock")));
  }

  @Test
  void start_removesSegmentFilesLeftByAnEarlierDaemon() throws Exception {
    backend.close();
    Path stale = shmDir().resolve("dev0").resolve("seg-999");
    Files.createDirectories(stale.getParent());
    Files.write(stale, new byte[] {1, 2, 3});

    backend = createBackend();

    assertFalse(Files.exists(stale));
  }

  @Test
  void secondBackendOnTheSameDirectory_isRefused() {
    BackendException e = assertThrows(BackendException.class, this::createBackend);

    assertTrue(e.getMessage().contains("in use by another gpumemd"), e.getMessage());
    // The refusal took nothing from the first one.
    assertTrue(Files.exists(path(allocate(0, 2 * MiB))));
  }

  @Test
  void directory_isUsableAgainOnceTheFirstBackendClosed() {
    backend.close();

    backend = createBackend();

    assertTrue(Files.exists(path(allocate(0, 2 * MiB))));
  }

  @Test
  void allocate_pastTheConfiguredCapacity_isOutOfMemoryUntilSomethingIsFreed() {
    SegmentMemory first = backend.allocate(0, CAPACITY / 2, SegmentOwner.DAEMON);
    allocate(0, CAPACITY / 2);
    allocate(1, CAPACITY / 2); // capacity is per device

    assertThrows(BackendOutOfMemoryException.class, () -> backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON));

    backend.free(first);
    backend.free(first); // a second free must not hand the capacity out twice
    allocate(0, CAPACITY / 2);
    assertThrows(BackendOutOfMemoryException.class, () -> backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON));
  }

  @Test
  void devices_reportTheConfiguredCapacity() {
    assertEquals(2, backend.devices().size());
    assertEquals(CAPACITY, backend.devices().get(1).capacityBytes());
    assertEquals("host", backend.devices().get(0).backend());
    assertEquals(shmDir().toAbsolutePath(), host().root());
  }

  @Test
  void freshSegments_areZeroed() {
    assertTrue(backend.freshSegmentsAreZeroed());
  }
}
