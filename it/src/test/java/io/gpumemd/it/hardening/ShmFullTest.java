package io.gpumemd.it.hardening;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Host devices larger than the shared-memory file system under them: an 8 MiB tmpfs beneath a
 * 64 MiB device. With segment files ({@code --host-segments path}) every lease granted can be
 * touched to its last byte (no SIGBUS), the lease that does not fit is RESOURCE_EXHAUSTED naming
 * the file system, and zeroing a cached block on the full file system works (its pages exist
 * since it was allocated). With descriptors the segments are memfds, which the small file system
 * does not limit. Needs root to mount the tmpfs, as CI has; skips with that reason otherwise.
 */
class ShmFullTest {
  private static final int MIB = 1 << 20;
  private Path mount;

  @BeforeEach
  void mountSmallTmpfs() throws Exception {
    mount = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-tmpfs-");
    Process p = new ProcessBuilder("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mount.toString())
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    boolean mounted = p.waitFor(10, TimeUnit.SECONDS) && p.exitValue() == 0;
    if (!mounted) {
      Files.deleteIfExists(mount);
    }
    Assumptions.assumeTrue(mounted, "needs root to mount a small tmpfs: " + out.trim());
  }

  @AfterEach
  void unmount() throws Exception {
    new ProcessBuilder("umount", mount.toString()).start().waitFor(10, TimeUnit.SECONDS);
    Files.deleteIfExists(mount);
  }

  @Test
  void fullFileSystem_refusesLeases_andEveryGrantedByteCanBeTouched() {
    try (TestDaemon daemon = TestDaemon.start("--shm-dir", mount.resolve("shm").toString(), "--host-devices", "1",
        "--host-device-bytes", "64MiB", "--unmap-wait-ms", "100", "--host-segments", "path");
         GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      List<Lease> granted = new ArrayList<>();
      GpuMemException refused = null;
      for (int i = 0; i < 64 && refused == null; i++) {
        try {
          granted.add(client.lease(0, MIB));
        } catch (GpuMemException e) {
          refused = e;
        }
      }
      assertNotNull(refused, "an 8 MiB file system cannot hold 64 leases of 1 MiB");
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, refused.code(), refused.getMessage());
      assertTrue(refused.getMessage().contains("no room"), refused.getMessage());
      assertTrue(granted.size() >= 4, "granted before the file system filled: " + granted.size());
      // Touch every page of every granted lease: a sparse file would fault here.
      for (Lease lease : granted) {
        ByteBuffer bytes = lease.buffer();
        for (int off = 0; off < bytes.capacity(); off += 4096) {
          bytes.put(off, (byte) 0x7e);
        }
        bytes.put(bytes.capacity() - 1, (byte) 0x7e);
      }
      // A cached block zeroed on the full file system: its pages exist, so this cannot fail.
      Lease last = granted.remove(granted.size() - 1);
      last.close();
      try (Lease zeroed = client.lease(0, MIB, true, "zeroed")) {
        ByteBuffer bytes = zeroed.buffer();
        for (int off = 0; off < bytes.capacity(); off += 4096) {
          assertEquals(0, bytes.get(off), "offset " + off);
        }
      }
      granted.forEach(Lease::close);
      daemon.verifyInvariants();
    }
  }

  /**
   * With segments passed as descriptors ({@code --host-segments fd}) the segments are sealed
   * memfds, on no file system of the daemon's: through the registry, the device's 64 MiB are
   * leased whole although the shm directory's tmpfs holds 8 MiB, nothing lands on it, the next
   * lease is refused by the device's capacity, and a cached block written through a descriptor is
   * zeroed when leased again with {@code zero}.
   */
  @Test
  void smallFileSystem_withDescriptors_limitsNothing_andZeroes() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--shm-dir", mount.resolve("shm").toString(), "--host-devices", "1",
        "--host-device-bytes", "64MiB", "--unmap-wait-ms", "100", "--host-segments", "fd")) {
      SessionRegistry registry = daemon.server().registry();
      String session = registry.open(Caller.DAEMON, "shm-full", 0, -1).id();
      List<LeaseRecord> granted = new ArrayList<>();
      for (int i = 0; i < 64; i++) {
        granted.add(registry.lease(Caller.DAEMON, session, 0, MIB, false, "", false));
      }
      ExhaustedException refused = assertThrows(ExhaustedException.class,
          () -> registry.lease(Caller.DAEMON, session, 0, MIB, false, "", false));
      assertTrue(!refused.getMessage().contains("no room"), "the device is full, not a file system: " + refused);
      try (Stream<Path> files = Files.walk(mount)) {
        assertEquals(List.of(), files.filter(Files::isRegularFile)
            .filter(f -> !f.getFileName().toString().equals(".gpumemd.lock")).toList(), "no segment file on a path");
      }
      LeaseRecord last = granted.remove(granted.size() - 1);
      try (SegmentFd d = ((FdPassedSegment) last.block().memory()).open(false);
           FileChannel channel = FileChannel.open(Path.of("/proc/self/fd/" + d.number()), StandardOpenOption.WRITE)) {
        ByteBuffer ones = ByteBuffer.allocate(MIB);
        while (ones.hasRemaining()) {
          ones.put((byte) 0x7e);
        }
        channel.write(ones.flip(), last.block().offset());
      }
      registry.release(Caller.DAEMON, session, last.id(), new byte[0]);
      LeaseRecord zeroed = registry.lease(Caller.DAEMON, session, 0, MIB, true, "zeroed", false);
      assertEquals(List.of(last.block().segmentId(), last.block().offset()),
          List.of(zeroed.block().segmentId(), zeroed.block().offset()), "the written block, reused");
      try (SegmentFd d = ((FdPassedSegment) zeroed.block().memory()).open(true);
           FileChannel channel = FileChannel.open(Path.of("/proc/self/fd/" + d.number()), StandardOpenOption.READ)) {
        ByteBuffer bytes = ByteBuffer.allocate(MIB);
        while (bytes.hasRemaining() && channel.read(bytes, zeroed.block().offset() + bytes.position()) > 0) {
          // reads until the block is in
        }
        assertEquals(MIB, bytes.position());
        for (int off = 0; off < MIB; off++) {
          assertEquals(0, bytes.get(off), "offset " + off);
        }
      }
      daemon.verifyInvariants();
    }
  }
}
