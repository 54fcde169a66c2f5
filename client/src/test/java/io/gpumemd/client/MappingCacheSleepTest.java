package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.jna.Native;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.MemoryHandle;
import io.grpc.Status;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The client's half of sleep and wake in {@link MappingCache}, on real mappings of real files
 * (host segments as {@code --host-segments path} gives them) and without a daemon: which
 * segments a sleep vacates, what a refused or partial sleep fills again, how a wake maps another
 * segment into the old range and renames it for every lease on it, and what closing a sleeping
 * lease does. A vacated range is never touched here (that faults): its state is read from the
 * mapping. The same against a real daemon: {@code SleepWakeTest}.
 */
class MappingCacheSleepTest {
  private static final long BYTES = 64 << 10;

  @TempDir
  Path dir;
  private final List<Long> acked = new ArrayList<>();
  private final MappingCache cache = new MappingCache(acked::add, null, "session", Map.of());

  @AfterEach
  void close() {
    cache.closeAll();
  }

  @Test
  void sleepWithoutTags_vacatesEverySegmentWithALease_andClosesTheIdleOnes() throws IOException {
    Lease a = lease(1, "a", 0, "weights");
    Lease b = lease(2, "b", 4096, "");
    Lease idle = lease(3, "c", 0, "");
    cache.release(idle);

    MappingCache.Vacated vacated = cache.vacateForSleep(Set.of());

    assertEquals(Set.of(1L, 2L, 3L), Set.copyOf(vacated.ids()), "the idle one is named too: it is unmapped");
    assertEquals(List.of(3L), acked, "the idle segment's unmap is told to the daemon");
    assertTrue(host(a).vacated());
    assertTrue(host(b).vacated());
    assertEquals(2, cache.size());
    cache.slept(vacated, List.of(1L, 2L), 1);
    assertTrue(a.isAsleep());
    assertTrue(b.isAsleep());
    assertEquals(2, cache.asleep());
  }

  @Test
  void sleepWithTags_vacatesOnlyTheSegmentsOfTaggedLeases_byTheDaemonsTag() throws IOException {
    Lease weights = lease(1, "a", 0, "weights");
    Lease kv = lease(2, "b", 0, "kv");
    Lease again = new Lease(kv, 512, "weights"); // served from the client cache: the daemon still says "kv"

    MappingCache.Vacated vacated = cache.vacateForSleep(Set.of("weights"));

    assertEquals(List.of(1L), vacated.ids());
    assertTrue(host(weights).vacated());
    assertFalse(host(kv).vacated());
    assertFalse(host(again).vacated());
  }

  @Test
  void wake_mapsTheNewSegmentIntoTheOldRange_andRenamesItForEveryLease() throws IOException {
    Lease first = lease(1, "a", 0, "");
    Lease second = lease(1, "a", 8192, "");
    ByteBuffer buffer = first.buffer();
    long address = address(buffer);
    fill("b2", (byte) 0x5a);
    cache.slept(cache.vacateForSleep(Set.of()), List.of(1L), 1);

    assertTrue(cache.wake(1, handle(7, "b2")));

    assertFalse(host(first).vacated());
    assertFalse(first.isAsleep());
    assertEquals(7, first.segmentId());
    assertEquals(7, second.segmentId(), "every lease on the segment moved with it");
    assertEquals(dir.resolve("b2").toString(), first.hostShmPath());
    assertEquals(address, address(first.buffer()), "the same address");
    assertEquals(0x5a, buffer.get(0), "the buffer made before the sleep sees the new segment");
    assertSame(first.segment(), cache.acquire(0, handle(7, "b2"), false, "").segment(), "known by its new id");
    assertEquals(0, cache.asleep());
    assertEquals(List.of(), acked);
  }

  @Test
  void refusedSleep_fillsEveryRangeFromItsOwnSegment_andNothingSleeps() throws IOException {
    Lease lease = lease(1, "a", 0, "");
    fill("a", (byte) 0x11);
    MappingCache.Vacated vacated = cache.vacateForSleep(Set.of());
    GpuMemException refusal = new GpuMemException(Status.Code.FAILED_PRECONDITION, "shared", null);

    cache.sleepRefused(vacated, 1, refusal);

    assertFalse(host(lease).vacated());
    assertFalse(lease.isAsleep());
    assertEquals(0x11, lease.buffer().get(0));
    assertEquals(0, refusal.getSuppressed().length);
  }

  @Test
  void refusedSleep_whoseSegmentIsGone_staysVacatedAndAsleep_forAWake() throws IOException {
    Lease lease = lease(1, "a", 0, "");
    MappingCache.Vacated vacated = cache.vacateForSleep(Set.of());
    assertTrue(dir.resolve("a").toFile().delete()); // the daemon did let it go: the outcome was unknown
    GpuMemException refusal = new GpuMemException(Status.Code.UNAVAILABLE, "connection broke", null);

    cache.sleepRefused(vacated, 2, refusal);

    assertTrue(host(lease).vacated());
    assertTrue(lease.isAsleep());
    assertEquals(1, refusal.getSuppressed().length, "the refill's failure travels with the refusal");
  }

  @Test
  void vacatedSegmentTheDaemonDidNotSleep_isFilledAgain() throws IOException {
    Lease lease = lease(1, "a", 0, "");
    cache.slept(cache.vacateForSleep(Set.of()), List.of(), 1);
    assertFalse(host(lease).vacated());
    assertFalse(lease.isAsleep());
  }

  @Test
  void closingTheLastSleepingLease_closesTheRange_andAWakeOfItIsToldUnmapped() throws IOException {
    Lease lease = lease(1, "a", 0, "");
    HostMapping mapping = host(lease);
    cache.slept(cache.vacateForSleep(Set.of()), List.of(1L), 1);

    cache.release(lease);
    assertEquals(0, cache.size());
    assertThrows(IllegalStateException.class, () -> mapping.slice(0, 1), "closed");

    assertFalse(cache.wake(1, handle(9, "b")));
    assertEquals(List.of(9L), acked, "the daemon is told the woken segment is not mapped here");
  }

  @Test
  void legacyCudaMapping_refusesTheSleep_beforeAnythingChanges() throws IOException {
    Lease lease = lease(1, "a", 0, "");
    cache.track(2, new SegmentMapping() {
      @Override
      public void close() {}
    });

    GpuMemException e = assertThrows(GpuMemException.class, () -> cache.vacateForSleep(Set.of()));

    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
    assertTrue(e.getMessage().contains("--cuda-handles vmm"), e.getMessage());
    assertFalse(host(lease).vacated());
  }

  // ---------------------------------------------------------------------------- helpers

  /** A lease of 4 KiB at {@code offset} of segment {@code id}, the file {@code name} in the test's directory. */
  private Lease lease(long id, String name, long offset, String tag) throws IOException {
    MemoryHandle handle = handle(id, name).toBuilder().setOffset(offset).build();
    MappingCache.Acquired acquired = cache.acquire(0, handle, false, tag);
    LeaseResponse response = LeaseResponse.newBuilder().setLeaseId("lease-" + id + "-" + offset)
        .setSizeBytes(4096).setBlockBytes(4096).setHandle(handle).build();
    return new Lease(null, response, acquired.segment(), acquired.mapping(), tag, false, false);
  }

  /** The handle of segment {@code id} in file {@code name}, made {@link #BYTES} long if new. */
  private MemoryHandle handle(long id, String name) throws IOException {
    Path file = dir.resolve(name);
    try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "rw")) {
      if (f.length() == 0) {
        f.setLength(BYTES);
      }
    }
    return MemoryHandle.newBuilder().setSegmentId(id).setSegmentBytes(BYTES).setHostShmPath(file.toString()).build();
  }

  private void fill(String name, byte value) throws IOException {
    handle(0, name);
    try (RandomAccessFile f = new RandomAccessFile(dir.resolve(name).toFile(), "rw")) {
      f.write(new byte[] {value});
    }
  }

  private static HostMapping host(Lease lease) {
    return (HostMapping) lease.mapping();
  }

  private static long address(ByteBuffer buffer) {
    return com.sun.jna.Pointer.nativeValue(Native.getDirectBufferPointer(buffer));
  }
}
