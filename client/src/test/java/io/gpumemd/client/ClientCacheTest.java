package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.MemoryHandle;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The client cache tier's choices, without a daemon: best fit, size classes, allowance, age. */
class ClientCacheTest {
  private static final long KIB = 1024;
  private static final long MIB = 1024 * KIB;
  /** The notices to the daemon are not this test's subject. */
  private static final ClientCache.Listener NO_NOTICES = new ClientCache.Listener() {
    @Override
    public void moved(String leaseId, boolean reused) {}

    @Override
    public void evicted(String leaseId) {}
  };
  private int next;

  /** A closed lease of {@code blockBytes} on {@code device} (no mapping: the cache never touches it). */
  private Lease lease(int device, long blockBytes) {
    LeaseResponse response = LeaseResponse.newBuilder().setLeaseId(String.format("%032x", next++)).setDevice(device)
        .setSizeBytes(blockBytes).setBlockBytes(blockBytes)
        .setHandle(MemoryHandle.newBuilder().setSegmentId(next).setHostShmPath("/dev/shm/x")).build();
    return new Lease(null, response, null, "", false, false);
  }

  @Test
  void take_isTheBestFit_ofTheDevice_roundedTo512() {
    ClientCache cache = new ClientCache(64 * MIB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Lease big = lease(0, 64 * KIB);
    Lease small = lease(0, 8 * KIB);
    Lease otherDevice = lease(1, 4 * KIB);
    cache.offer(big, NO_NOTICES);
    cache.offer(small, NO_NOTICES);
    cache.offer(otherDevice, NO_NOTICES);
    assertSame(small, cache.take(0, 5000, NO_NOTICES), "8 KiB is the smallest block of device 0 that holds 5,120 B");
    assertSame(big, cache.take(0, 4 * KIB, NO_NOTICES));
    assertNull(cache.take(0, 4 * KIB, NO_NOTICES), "device 0 is empty now");
    assertSame(otherDevice, cache.take(1, 4 * KIB - 100, NO_NOTICES));
    assertEquals(3, cache.localHits());
    assertEquals(3, cache.localReturns());
    assertEquals(0, cache.cachedBytes());
  }

  @Test
  void take_keepsTheDaemonsSizeClasses() {
    ClientCache cache = new ClientCache(256 * MIB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Lease huge = lease(0, 64 * MIB);
    cache.offer(huge, NO_NOTICES);
    assertNull(cache.take(0, 4 * KIB, NO_NOTICES), "a small request never takes a block larger than a small segment");
    assertNull(cache.take(0, 40 * MIB, NO_NOTICES), "nor a large one a block more than 20 MiB over it");
    assertSame(huge, cache.take(0, 50 * MIB, NO_NOTICES));
    Lease segment = lease(0, 2 * MIB);
    cache.offer(segment, NO_NOTICES);
    assertSame(segment, cache.take(0, 4 * KIB, NO_NOTICES), "a 2 MiB block serves a small request");
  }

  @Test
  void offer_keepsTheAllowance_byGivingBackTheOldest_andRefusesABlockLargerThanIt() {
    ClientCache cache = new ClientCache(10 * MIB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Lease a = lease(0, 4 * MIB);
    Lease b = lease(0, 4 * MIB);
    assertEquals(List.of(), cache.offer(a, NO_NOTICES));
    assertEquals(List.of(), cache.offer(b, NO_NOTICES));
    Lease c = lease(0, 4 * MIB);
    assertEquals(List.of(a), cache.offer(c, NO_NOTICES), "the least recently cached goes back");
    assertEquals(8 * MIB, cache.cachedBytes());
    assertNull(cache.offer(lease(0, 11 * MIB), NO_NOTICES), "larger than the whole allowance: not kept");
    assertEquals(2, cache.cachedBlocks());
  }

  @Test
  void giveBack_andAllowance_takeTheOldestFirst() {
    ClientCache cache = new ClientCache(64 * MIB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Lease a = lease(0, MIB);
    Lease b = lease(1, MIB);
    Lease c = lease(0, 2 * MIB);
    Lease d = lease(0, MIB);
    cache.offer(a, NO_NOTICES);
    cache.offer(b, NO_NOTICES);
    cache.offer(c, NO_NOTICES);
    cache.offer(d, NO_NOTICES);
    assertEquals(List.of(a, c), cache.giveBack(0, 2 * MIB), "device 0, oldest first, until 2 MiB are out");
    assertEquals(List.of(b), cache.setAllowance(MIB), "then the allowance: oldest first until it fits");
    assertEquals(MIB, cache.cachedBytes());
    assertEquals(List.of(d), cache.giveBack(0, 0), "0 = all of the device");
    assertEquals(0, cache.cachedBlocks());
    assertTrue(cache.counters().get(0)[1] == 3 && cache.counters().get(1)[1] == 1, "returns counted per device");
  }

  @Test
  void offer_thatEvicts_recordsTheEvictionsReleaseBeforeTheNewcomer() {
    ClientCache cache = new ClientCache(64 * KIB, SizeClasses.DEFAULT_MAX_OVERSIZE);
    Lease old = lease(0, 48 * KIB);
    Lease newcomer = lease(0, 32 * KIB);
    List<String> heard = new java.util.ArrayList<>();
    ClientCache.Listener recorder = new ClientCache.Listener() {
      @Override
      public void moved(String leaseId, boolean reused) {
        heard.add((reused ? "reused " : "cached ") + leaseId);
      }

      @Override
      public void evicted(String leaseId) {
        heard.add("released " + leaseId);
      }
    };
    cache.offer(old, recorder);
    assertEquals(List.of(old), cache.offer(newcomer, recorder));
    // The daemon holds client-cached bytes to the allowance: the room is made before it hears of
    // the newcomer, whichever flush carries the notices.
    assertEquals(List.of("cached " + old.id(), "released " + old.id(), "cached " + newcomer.id()), heard);
  }
}
