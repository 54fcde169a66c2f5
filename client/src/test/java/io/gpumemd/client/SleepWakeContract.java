package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.jna.Native;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Sleep and wake of a Java client against a real daemon on the host backend (issue 35 items 2
 * and 6): every buffer handed out before the sleep reads the same bytes (level 1) or zeros
 * (level 2) at the same address after the wake; the memory a sleep frees serves another session
 * meanwhile; a refused sleep leaves every lease usable with its bytes; a sleeping lease can be
 * closed; a lease asked for while asleep is refused. One subclass per way the daemon hands out
 * host segments ({@code --host-segments path}, {@code fd}): a wake maps the new segment from
 * its file, or from the descriptor fetched from the fd channel.
 *
 * <p>The daemon's devices are small ({@value #DEVICE_MIB} MiB each), so that what one session
 * holds decides whether another's lease fits. Every test gets a daemon of its own: with
 * segments passed as descriptors, a process that keeps a connection to the fd channel keeps
 * every segment it was sent (the daemon cannot tell whether a descriptor still waits unread in
 * its socket), so the segments of earlier tests' sessions in this same JVM would fill the small
 * devices.
 */
abstract class SleepWakeContract {
  static final int DEVICE_MIB = 32;
  /** A large request: a segment of its own. */
  static final int BIG = 4 << 20;
  static final int SMALL = 64 << 10;

  private DaemonProcess daemon;
  private GpuMemClient client;
  private AdminGrpc.AdminBlockingStub admin;

  /** {@code path} or {@code fd}. */
  abstract String hostSegments();

  @BeforeEach
  void connect() {
    daemon = DaemonProcess.start("--host-segments", hostSegments(), "--host-device-bytes", DEVICE_MIB + "MiB");
    client = GpuMemClient.builder(daemon.unixTarget()).clientName("sleeper").connect();
    admin = AdminGrpc.newBlockingStub(client.connection().channel());
  }

  @AfterEach
  void disconnect() {
    client.close();
    daemon.close();
  }

  @Test
  void level1_everyBufferReadsItsBytesAtItsAddress_afterTheWake() {
    List<Lease> leases = List.of(client.lease(0, BIG, false, "weights"), client.lease(0, BIG, false, "weights"),
        client.lease(0, SMALL, false, "kv"), client.lease(1, SMALL, false, "kv"));
    List<ByteBuffer> buffers = buffers(leases);
    List<Long> addresses = addresses(buffers);
    fill(buffers);

    SleepResult slept = client.sleep(1);

    assertEquals(ids(leases), Set.copyOf(slept.leaseIds()));
    assertTrue(leases.stream().allMatch(Lease::isAsleep));
    assertEquals(Set.copyOf(slept.segmentIds()).size(), client.sleepingSegments());
    assertEquals(leases.stream().mapToLong(Lease::blockBytes).sum(), slept.hostBytes(), "level 1: contents kept");
    assertTrue(slept.freedBytes() >= 2L * BIG, "freed: " + slept.freedBytes());

    WakeResult woken = client.wake();

    assertEquals(ids(leases), Set.copyOf(woken.leaseIds()));
    assertFalse(leases.stream().anyMatch(Lease::isAsleep));
    assertEquals(0, client.sleepingSegments());
    assertEquals(addresses, addresses(buffers(leases)), "every lease at its old address");
    assertFilled(buffers, "the buffers handed out before the sleep");
    assertSegmentsAgree(leases);
    leases.forEach(Lease::close);
  }

  @Test
  void level2_everyBufferReadsZerosAtItsAddress_afterTheWake() {
    List<Lease> leases = List.of(client.lease(0, BIG), client.lease(0, SMALL));
    List<ByteBuffer> buffers = buffers(leases);
    List<Long> addresses = addresses(buffers);
    fill(buffers);

    assertEquals(0, client.sleep(2).hostBytes(), "level 2: nothing kept");
    client.wake();

    assertEquals(addresses, addresses(buffers(leases)));
    for (ByteBuffer b : buffers) {
      for (int i = 0; i < b.capacity(); i += 4093) {
        assertEquals(0, b.get(i), "zero at " + i);
      }
    }
    buffers.get(0).put(0, (byte) 7); // writable again
    assertEquals(7, leases.get(0).buffer().get(0));
    leases.forEach(Lease::close);
  }

  @Test
  void duringTheSleep_anotherSession_leasesTheMemoryItFreed() throws InterruptedException {
    List<Lease> leases = new ArrayList<>();
    for (int i = 0; i < 6; i++) { // 24 of the device's 32 MiB
      leases.add(client.lease(1, BIG, false, "weights"));
    }
    List<ByteBuffer> buffers = buffers(leases);
    fill(buffers);
    long wanted = 16L << 20;
    // No client cache: its close releases the lease at once.
    try (GpuMemClient other = GpuMemClient.builder(daemon.unixTarget()).clientName("other").clientCacheBytes(0)
        .connect()) {
      GpuMemException full = assertThrows(GpuMemException.class, () -> other.lease(1, wanted));
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, full.code(), "before the sleep it does not fit");

      client.sleep(1);
      Lease theirs = other.lease(1, wanted);
      theirs.buffer().put(0, (byte) 0x77);

      GpuMemException noRoom = assertThrows(GpuMemException.class, client::wake);
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, noRoom.code(), "the memory is the other's now");
      assertTrue(leases.stream().allMatch(Lease::isAsleep), "a refused wake leaves the session asleep");
      theirs.close();
      wakeWhenTheMemoryIsBack(); // the other session still open: it is asked to unmap its segment
    }
    assertFilled(buffers, "after the other session's use of the memory");
    assertSegmentsAgree(leases);
    leases.forEach(Lease::close);
  }

  @Test
  void refusedSleep_ofASharedLease_leavesEveryLeaseUsableWithItsBytes() {
    List<Lease> leases = List.of(client.lease(0, BIG), client.lease(0, SMALL));
    List<ByteBuffer> buffers = buffers(leases);
    fill(buffers);
    Share share = leases.get(1).share();
    // Another session holds the shared block past the daemon's wait (--unmap-wait-ms, 2 s here).
    GpuMemClient holder = GpuMemClient.builder(daemon.unixTarget()).clientName("holder").connect();
    Lease hold = holder.attach(share.token());

    GpuMemException refused = assertThrows(GpuMemException.class, () -> client.sleep(1));

    assertEquals(Status.Code.FAILED_PRECONDITION, refused.code(), refused.getMessage());
    assertTrue(refused.getMessage().contains("hold " + hold.id()), refused.getMessage());
    hold.close();
    holder.close();
    assertFalse(leases.stream().anyMatch(Lease::isAsleep));
    assertEquals(0, client.sleepingSegments());
    assertFilled(buffers, "after the refusal");
    buffers.get(0).put(1, (byte) 0x42);
    assertEquals(0x42, leases.get(0).buffer().get(1), "writable");
    Lease fresh = client.lease(0, SMALL); // the session is awake: leasing goes on
    fresh.close();
    share.close();
    leases.forEach(Lease::close);
  }

  @Test
  void sleepingLease_closes_andTheDaemonReleasesIt() throws InterruptedException {
    Lease kept = client.lease(0, BIG);
    Lease closed = client.lease(0, BIG);
    ByteBuffer buffer = kept.buffer();
    fill(List.of(buffer));
    client.sleep(1);

    closed.close();

    awaitLeases(Set.of(kept.id()));
    client.wake();
    assertFalse(kept.isAsleep());
    assertFilled(List.of(buffer), "the lease still held");
    kept.close();
    assertEquals(1, client.stats().cachedBlocks(), "awake: a closed lease goes to the client cache again");
  }

  @Test
  void leaseWhileAsleep_isRefusedByTheDaemon_andTheClientCacheServesNothing() {
    Lease cached = client.lease(0, SMALL);
    cached.close(); // into the client cache
    assertEquals(1, client.stats().cachedBlocks());
    Lease held = client.lease(0, BIG);

    client.sleep(1);

    assertEquals(0, client.stats().cachedBlocks(), "given back at the sleep");
    GpuMemException refused = assertThrows(GpuMemException.class, () -> client.lease(0, SMALL));
    assertEquals(Status.Code.FAILED_PRECONDITION, refused.code(), refused.getMessage());
    client.wake();
    Lease after = client.lease(0, SMALL);
    assertFalse(after.isAsleep());
    after.close();
    assertEquals(1, client.stats().cachedBlocks(), "kept again once awake");
    held.close();
  }

  @Test
  void sleepWithTags_sleepsTheSegmentsOfThoseLeasesOnly() {
    Lease kv = client.lease(0, BIG, false, "kv");
    Lease weights = client.lease(0, BIG, false, "weights");
    List<ByteBuffer> buffers = buffers(List.of(kv, weights));
    fill(buffers);

    SleepResult slept = client.sleep(2, "kv");

    assertEquals(List.of(kv.id()), slept.leaseIds());
    assertTrue(kv.isAsleep());
    assertFalse(weights.isAsleep());
    assertFilled(buffers.get(1), 1, "the awake lease, usable meanwhile");
    client.wake();
    assertEquals(0, buffers.get(0).get(0), "level 2: the slept lease reads zeros");
    assertFilled(buffers.get(1), 1, "the awake lease after the wake");
    kv.close();
    weights.close();
  }

  // ---------------------------------------------------------------------------- helpers

  private static List<ByteBuffer> buffers(List<Lease> leases) {
    return leases.stream().map(Lease::buffer).toList();
  }

  private static List<Long> addresses(List<ByteBuffer> buffers) {
    return buffers.stream().map(b -> com.sun.jna.Pointer.nativeValue(Native.getDirectBufferPointer(b))).toList();
  }

  private static Set<String> ids(List<Lease> leases) {
    return leases.stream().map(Lease::id).collect(Collectors.toSet());
  }

  /** A pattern that differs per buffer and per position. */
  private static byte pattern(int buffer, int i) {
    return (byte) (buffer * 31 + i * 7 + 1);
  }

  private static void fill(List<ByteBuffer> buffers) {
    for (int b = 0; b < buffers.size(); b++) {
      ByteBuffer buffer = buffers.get(b);
      for (int i = 0; i < buffer.capacity(); i++) {
        buffer.put(i, pattern(b, i));
      }
    }
  }

  private static void assertFilled(List<ByteBuffer> buffers, String what) {
    for (int b = 0; b < buffers.size(); b++) {
      assertFilled(buffers.get(b), b, what);
    }
  }

  /** {@code buffer} holds the pattern of the {@code b}-th buffer filled. */
  private static void assertFilled(ByteBuffer buffer, int b, String what) {
    for (int i = 0; i < buffer.capacity(); i++) {
      if (buffer.get(i) != pattern(b, i)) {
        throw new AssertionError(what + ": buffer " + b + " differs at " + i);
      }
    }
  }

  /**
   * Wakes, trying again (up to 5 s) while the daemon answers RESOURCE_EXHAUSTED: the segment
   * another session just gave back comes free once that session has unmapped it, which the
   * daemon asks for when a wake needs the memory (the session answers on its stream).
   */
  private void wakeWhenTheMemoryIsBack() throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (true) {
      try {
        client.wake();
        return;
      } catch (GpuMemException e) {
        if (e.code() != Status.Code.RESOURCE_EXHAUSTED || System.nanoTime() > deadline) {
          throw e;
        }
        assertTrue(client.sleepingSegments() > 0, "a refused wake leaves the session asleep");
        Thread.sleep(20);
      }
    }
  }

  /** The daemon has each lease in the segment and at the offset the client has it. */
  private void assertSegmentsAgree(List<Lease> leases) {
    Map<String, LeaseInfo> listed = listLeases().stream().collect(Collectors.toMap(LeaseInfo::getLeaseId,
        Function.identity()));
    for (Lease lease : leases) {
      LeaseInfo info = listed.get(lease.id());
      assertEquals(info.getSegmentId(), lease.segmentId(), lease.id());
      assertEquals(info.getOffset(), lease.offset(), lease.id());
    }
  }

  private List<LeaseInfo> listLeases() {
    return admin.listLeases(ListLeasesRequest.newBuilder().setSessionId(client.sessionId()).build()).getLeasesList();
  }

  /** Waits (up to 5 s) until the session's leases at the daemon are {@code ids}: a release is a notice. */
  private void awaitLeases(Set<String> ids) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    Set<String> now;
    while (!(now = listLeases().stream().map(LeaseInfo::getLeaseId).collect(Collectors.toSet())).equals(ids)
        && System.nanoTime() < deadline) {
      Thread.sleep(10);
    }
    assertEquals(ids, now);
  }
}
