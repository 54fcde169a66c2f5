package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.Channels;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Published;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The Java client on host segments passed as file descriptors ({@code --host-segments fd}, the
 * default), with the daemon and the clients as processes of their own: bytes written by one
 * process are read by another of the same tenant, a read-only hold's mapping is read-only down
 * to the kernel's page permissions, a SIGKILLed daemon leaves no file behind and its client
 * keeps its bytes, and 10,000 leases with trims between leak no descriptor in either process.
 *
 * <p>Another uid presenting a session and segment it does not own is refused with no
 * descriptor: {@code FdChannelTest} (the daemon's decision, every refusal) and {@code
 * python/tests/test_fd.py} (a real process under {@code setpriv} uid 65534) cover it.
 */
class FdSegmentProcessTest {
  private static final int SIZE = 64 * 1024;

  private static Map<String, String> peer(String... args) throws Exception {
    return ResultProcess.run(FdPeerMain.class, args);
  }

  /** Regular files under the daemon's shm dir but its lock: segments on a path. */
  private static List<Path> shmFiles(Path shmDir) throws IOException {
    if (!Files.exists(shmDir)) {
      return List.of();
    }
    try (Stream<Path> walk = Files.walk(shmDir)) {
      return walk.filter(Files::isRegularFile).filter(p -> !p.getFileName().toString().equals(".gpumemd.lock"))
          .collect(Collectors.toList());
    }
  }

  private static int descriptors(long pid) throws IOException {
    try (Stream<Path> fds = Files.list(Path.of("/proc/" + pid + "/fd"))) {
      return (int) fds.count();
    }
  }

  private static void fill(ByteBuffer buffer, byte value) {
    for (int i = 0; i < SIZE; i++) {
      buffer.put(i, value);
    }
  }

  private static boolean uniform(ByteBuffer buffer, byte value) {
    for (int i = 0; i < SIZE; i++) {
      if (buffer.get(i) != value) {
        return false;
      }
    }
    return true;
  }

  @Test
  void bytesWrittenByOneProcess_areReadByAnother_andAReadOnlyHoldMapsReadOnly() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--host-segments", "fd");
         GpuMemClient holder = GpuMemClient.connect(daemon.unixTarget());
         Lease lease = holder.lease(0, SIZE)) {
      assertNull(lease.hostShmPath(), "a segment passed by descriptor has no path");
      fill(lease.buffer(), (byte) 0x5a);
      assertEquals(1, holder.fdChannel().fetched());
      assertEquals(List.of(), shmFiles(daemon.shmDir()), "nothing of the segment is on a path");

      try (Published rw = holder.publish(lease, "fd-rw")) {
        Map<String, String> seen = peer(daemon.unixTarget(), "fd-rw", Integer.toString(SIZE), Integer.toString(0xa5));
        assertEquals(Integer.toString(0x5a), seen.get("first"), seen.get("output"));
        assertEquals("true", seen.get("uniform"));
        assertEquals("false", seen.get("readOnly"));
        assertEquals("true", seen.get("written"));
        assertEquals("rw-s", seen.get("perms"), "a shared writable mapping");
        assertEquals("none", seen.get("path"));
        assertEquals("1", seen.get("fetched"), "one descriptor for the peer's one mapping");
        assertTrue(uniform(lease.buffer(), (byte) 0xa5), "the peer's bytes, seen here");
      }

      try (Published ro = holder.publish(lease, "fd-ro", true)) {
        Map<String, String> seen = peer(daemon.unixTarget(), "fd-ro", Integer.toString(SIZE), "1");
        assertEquals(Integer.toString(0xa5), seen.get("first"), seen.get("output"));
        assertEquals("true", seen.get("uniform"));
        assertEquals("true", seen.get("readOnly"));
        assertEquals("refused", seen.get("written"), "writes through a read-only hold throw");
        assertEquals("r--s", seen.get("perms"), "the kernel maps it read-only (an O_RDONLY descriptor)");
        assertTrue(uniform(lease.buffer(), (byte) 0xa5), "nothing changed");
      }
    }
  }

  @Test
  void aSigkilledDaemon_leavesNoFile_andItsClientKeepsWhatItWrote() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--host-segments", "fd");
    try (GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      Lease lease = client.lease(0, SIZE);
      ByteBuffer buffer = lease.buffer();
      fill(buffer, (byte) 0x3c);
      assertEquals(List.of(), shmFiles(daemon.shmDir()));

      daemon.process().destroyForcibly(); // SIGKILL: no shutdown of any kind
      assertTrue(daemon.process().waitFor(30, TimeUnit.SECONDS), "the daemon is gone");
      assertEquals(List.of(), shmFiles(daemon.shmDir()), "a killed daemon leaves no segment file");
      assertTrue(uniform(buffer, (byte) 0x3c), "the mapping outlives the daemon");
      fill(buffer, (byte) 0x3d);
      assertTrue(uniform(buffer, (byte) 0x3d), "and stays writable");
    } finally {
      daemon.close();
    }
  }

  @Test
  void tenThousandLeases_withTrimsBetween_leakNoDescriptor_inTheDaemonOrTheClient() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--host-segments", "fd");
         Channels.Connection admin = Channels.open(daemon.unixTarget());
         // unary calls: a release has reached the daemon when close() returns, so a trim frees it
         GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      AdminGrpc.AdminBlockingStub trims = AdminGrpc.newBlockingStub(admin.channel());
      long pid = daemon.process().pid();
      long self = ProcessHandle.current().pid();
      client.lease(0, 4096).close(); // the fd channel's connection, and everything else, opened
      trimAndAwaitUnmapped(trims, client, pid, Integer.MAX_VALUE);
      int daemonBefore = descriptors(pid);
      int clientBefore = descriptors(self);

      for (int i = 0; i < 10_000; i++) {
        try (Lease lease = client.lease(0, i % 2 == 0 ? 4096 : 100_000)) {
          lease.buffer().put(0, (byte) i);
        }
        if (i % 100 == 99) {
          trims.trim(TrimRequest.newBuilder().setDevice(0).setKeepBytes(0).build()); // a new segment next
        }
      }
      long opened = client.mapsOpened();
      trimAndAwaitUnmapped(trims, client, pid, daemonBefore);
      // a leak would be one descriptor per segment or fetch: ~100 of them
      assertTrue(descriptors(pid) <= daemonBefore, "the daemon's descriptors: " + descriptors(pid) + ", before "
          + daemonBefore);
      // The client's side closes on its own threads (CI once counted one more, then none more
      // as the message was built): give it the same bounded wait the daemon's side gets.
      await(() -> {
        try {
          return descriptors(self) <= clientBefore;
        } catch (IOException e) {
          throw new IllegalStateException(e);
        }
      }, "the client closed its segments' descriptors");
      assertTrue(descriptors(self) <= clientBefore, "the client's descriptors: " + descriptors(self) + ", before "
          + clientBefore);
      assertTrue(opened >= 100, "the trims made new segments: " + opened + " mappings");
      assertEquals(opened, client.fdChannel().fetched(), "each mapping from one fetched descriptor");
      assertEquals(List.of(), shmFiles(daemon.shmDir()));
    }
  }

  /**
   * Trims device 0 and waits (bounded) until the client has unmapped everything and the
   * daemon's descriptors are down to {@code daemonTarget}.
   */
  private static void trimAndAwaitUnmapped(AdminGrpc.AdminBlockingStub trims, GpuMemClient client, long pid,
      int daemonTarget) throws Exception {
    trims.trim(TrimRequest.newBuilder().setDevice(0).setKeepBytes(0).build());
    await(() -> client.mappedSegments() == 0, "the client unmapped every segment");
    await(() -> {
      try {
        return descriptors(pid) <= daemonTarget;
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
    }, "the daemon closed its segments' descriptors");
  }

  private static void await(BooleanSupplier condition, String what) throws InterruptedException {
    for (int i = 0; i < 1000 && !condition.getAsBoolean(); i++) {
      Thread.sleep(10);
    }
    assertTrue(condition.getAsBoolean(), "not within 10 s: " + what);
  }
}
