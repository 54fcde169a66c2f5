package io.gpumemd.server.backend.host;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.MemoryBackendContractTest;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The {@link MemoryBackendContractTest} on the host backend with segments passed as descriptors
 * ({@code --host-segments fd}), reading and writing segments through descriptors the backend
 * opens, as a client would through the ones the fd channel hands it; plus what is particular to
 * it: no segment on a path, read-only descriptors, memory that outlives the daemon's free while
 * a descriptor holds it, and the daemon's own descriptors closed on free and at close.
 */
class HostFdBackendTest extends MemoryBackendContractTest {
  private static final long CAPACITY = 64 * MiB;
  private static final String FD_SOCKET = "/run/gpumemd/gpumemd.sock.fd";

  @TempDir
  Path tmp;

  private Path shmDir() {
    return tmp.resolve("shm");
  }

  @Override
  protected MemoryBackend createBackend() {
    return new HostShmBackend(shmDir(), 2, CAPACITY, null, FD_SOCKET);
  }

  private static SegmentFd open(SegmentMemory segment, boolean readOnly) throws Exception {
    SegmentFd descriptor = ((FdPassedSegment) segment).open(readOnly);
    assertNotNull(descriptor, "a live segment opens a descriptor");
    return descriptor;
  }

  private static Path procPath(SegmentFd descriptor) {
    return Path.of("/proc/self/fd/" + descriptor.number());
  }

  @Override
  protected byte[] read(SegmentMemory segment, long offset, int length) throws Exception {
    try (SegmentFd descriptor = open(segment, true);
        FileChannel channel = FileChannel.open(procPath(descriptor), StandardOpenOption.READ)) {
      return readAt(channel, offset, length);
    }
  }

  private static byte[] readAt(FileChannel channel, long offset, int length) throws Exception {
    ByteBuffer buffer = ByteBuffer.allocate(length);
    while (buffer.hasRemaining()) {
      if (channel.read(buffer, offset + buffer.position()) < 0) {
        throw new AssertionError("segment shorter than " + (offset + length));
      }
    }
    return buffer.array();
  }

  @Override
  protected void write(SegmentMemory segment, long offset, byte[] bytes) throws Exception {
    try (SegmentFd descriptor = open(segment, false);
        FileChannel channel = FileChannel.open(procPath(descriptor), StandardOpenOption.WRITE)) {
      ByteBuffer buffer = ByteBuffer.wrap(bytes);
      while (buffer.hasRemaining()) {
        channel.write(buffer, offset + buffer.position());
      }
    }
  }

  /** The file a descriptor of the segment opens (its inode): handles all name the fd channel. */
  @Override
  protected String mappedBy(SegmentMemory segment) throws Exception {
    try (SegmentFd descriptor = open(segment, true)) {
      return "inode " + Files.getAttribute(procPath(descriptor), "unix:ino");
    }
  }

  @Override
  protected void assertReleased(List<SegmentMemory> segments) throws Exception {
    for (SegmentMemory segment : segments) {
      assertNull(((FdPassedSegment) segment).open(false), "a freed segment opens no descriptor: " + segment);
    }
  }

  private List<Path> filesUnder(Path dir) throws Exception {
    try (Stream<Path> files = Files.walk(dir)) {
      return files.filter(Files::isRegularFile).filter(p -> !p.getFileName().toString().equals(".gpumemd.lock"))
          .toList();
    }
  }

  // ---------------------------------------------------------------------------- descriptors only

  @Test
  void segment_isOnNoPath_andItsHandleNamesTheFdChannel() throws Exception {
    SegmentMemory segment = allocate(1, 4 * MiB);

    assertEquals(new IpcHandle.HostFd(FD_SOCKET), segment.handle());
    assertEquals(List.of(), filesUnder(shmDir()), "no segment file on a path");
    try (SegmentFd descriptor = open(segment, false)) {
      String target = Files.readSymbolicLink(procPath(descriptor)).toString();
      assertTrue(target.startsWith("/memfd:gpumemd-seg-1-") && target.endsWith(" (deleted)"), target);
      assertEquals(4 * MiB, Files.size(procPath(descriptor)));
    }
  }

  @Test
  void segment_isAMemfdSealedAgainstResizing_notWriting_mode0600() throws Exception {
    SegmentMemory segment = allocate(0, 2 * MiB);

    try (SegmentFd writable = open(segment, false)) {
      int seals = Memfds.seals(writable.number());
      assertEquals(Memfds.SEGMENT_SEALS, seals & Memfds.SEGMENT_SEALS, Memfds.describe(seals));
      assertEquals(0, seals & (Memfds.F_SEAL_WRITE | Memfds.F_SEAL_FUTURE_WRITE), Memfds.describe(seals));
      assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(procPath(writable))));
      // Even the daemon's own uid cannot resize it through a writable descriptor.
      try (RandomAccessFile file = new RandomAccessFile(procPath(writable).toFile(), "rw")) {
        IOException grow = assertThrows(IOException.class, () -> file.setLength(4 * MiB));
        assertTrue(grow.getMessage().contains("Operation not permitted"), grow.getMessage());
        IOException shrink = assertThrows(IOException.class, () -> file.setLength(MiB));
        assertTrue(shrink.getMessage().contains("Operation not permitted"), shrink.getMessage());
      }
      assertEquals(2 * MiB, Files.size(procPath(writable)));
    }
    write(segment, 2 * MiB - 3, new byte[] {1, 2, 3});
    backend.zero(segment, 0, 2 * MiB);
    assertArrayEquals(new byte[3], read(segment, 2 * MiB - 3, 3), "writes up to the end work, the daemon's too");
  }

  @Test
  void descriptor_readOnly_isOpenedReadOnly_writableReadWrite() throws Exception {
    SegmentMemory segment = allocate(0, 2 * MiB);

    try (SegmentFd readOnly = open(segment, true); SegmentFd writable = open(segment, false)) {
      assertEquals(0, accessMode(readOnly), "O_RDONLY");
      assertTrue(readOnly.readOnly());
      assertEquals(2, accessMode(writable), "O_RDWR");
      assertTrue(readOnly.number() != writable.number());
    }
  }

  /** The O_ACCMODE bits of a descriptor's flags, from /proc/self/fdinfo. */
  static int accessMode(SegmentFd descriptor) throws Exception {
    for (String line : Files.readAllLines(Path.of("/proc/self/fdinfo/" + descriptor.number()))) {
      if (line.startsWith("flags:")) {
        return Integer.parseInt(line.substring(6).trim(), 8) & 3;
      }
    }
    throw new AssertionError("no flags for " + descriptor);
  }

  @Test
  void memory_outlivesTheFree_whileADescriptorHoldsIt() throws Exception {
    SegmentMemory segment = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    byte[] pattern = {7, 6, 5, 4, 3, 2, 1};
    write(segment, 12345, pattern);

    try (SegmentFd held = open(segment, true);
        FileChannel channel = FileChannel.open(procPath(held), StandardOpenOption.READ)) {
      backend.free(segment);

      assertNull(((FdPassedSegment) segment).open(true), "freed: no new descriptors");
      assertArrayEquals(pattern, readAt(channel, 12345, pattern.length), "a client's descriptor keeps the bytes");
    }
  }

  @Test
  void free_andClose_closeTheDaemonsDescriptors() throws Exception {
    HostFdSegment freed = (HostFdSegment) backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    HostFdSegment kept = (HostFdSegment) allocate(1, 4 * MiB);
    String freedFile = daemonsFile(freed);
    assertTrue(freedFile.endsWith(" (deleted)"), freedFile);

    backend.free(freed);
    assertTrue(!freedFile.equals(daemonsFile(freed)), "the daemon's descriptor of a freed segment is closed");
    String keptFile = daemonsFile(kept);
    backend.close();

    assertTrue(!keptFile.equals(daemonsFile(kept)), "close closes the descriptors of live segments");
    assertTrue(!Files.exists(shmDir()), "the directory it made is gone");
  }

  /** What the daemon's own descriptor of a segment names now ("" when the number is closed). */
  private static String daemonsFile(HostFdSegment segment) throws Exception {
    Path link = Path.of("/proc/self/fd/" + segment.number());
    return Files.exists(link, java.nio.file.LinkOption.NOFOLLOW_LINKS) ? Files.readSymbolicLink(link).toString() : "";
  }

  @Test
  void capacity_isCountedAndGivenBackOnFree() throws Exception {
    SegmentMemory half = backend.allocate(0, CAPACITY / 2, SegmentOwner.DAEMON);
    allocate(0, CAPACITY / 2);
    org.junit.jupiter.api.Assertions.assertThrows(io.gpumemd.server.backend.BackendOutOfMemoryException.class,
        () -> backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON));

    backend.free(half);
    backend.free(half); // a second free must not give the capacity back twice
    allocate(0, CAPACITY / 2);
    org.junit.jupiter.api.Assertions.assertThrows(io.gpumemd.server.backend.BackendOutOfMemoryException.class,
        () -> backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON));
  }
}
