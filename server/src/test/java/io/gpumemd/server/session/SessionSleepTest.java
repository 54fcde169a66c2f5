package io.gpumemd.server.session;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Sleep and wake of sessions over a real host-backend pool (segments are shared-memory files,
 * read and written here as a client would): what sleeps, where it wakes, its bytes, the memory
 * it frees meanwhile, and the refusals that change nothing.
 */
class SessionSleepTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private Pool pool;
  private DevicePools pools;
  private SessionRegistry registry;

  /** A host-backend pool of one 64 MiB device and a registry over it. */
  record Pool(HostShmBackend backend, DevicePools pools, SessionRegistry registry) {
    static Pool start(Path dir, long poolBytes, long unmapWaitMillis, long offloadMaxBytes) {
      HostShmBackend backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
      LiveSessions sessions = new LiveSessions();
      DevicePool pool = new DevicePool(backend.devices().get(0), backend,
          new PoolSettings(poolBytes, poolBytes, 20 * MIB, unmapWaitMillis), sessions, DevicePools.segmentIdBase(0),
          Ticker.system());
      DevicePools pools = new DevicePools(List.of(pool));
      return new Pool(backend, pools, new SessionRegistry(pools, backend,
          new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of()), Ticker.system(), sessions,
          offloadMaxBytes));
    }

    /** Checks the pool's invariants, then closes it. */
    void close() {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  private void start(long poolBytes, long offloadMaxBytes) {
    pool = Pool.start(dir, poolBytes, 50, offloadMaxBytes);
    pools = pool.pools();
    registry = pool.registry();
  }

  @AfterEach
  void verifyAndClose() {
    if (pool != null) {
      pool.close();
    }
  }

  private long stat(PoolMetric metric) {
    return pools.get(0).stats().get(metric);
  }

  private LeaseRecord lease(Session s, long bytes, String tag) {
    return registry.lease(Caller.DAEMON, s.id(), 0, bytes, false, tag, false);
  }

  /** The lease's bytes as a client maps them: its segment's file, at its offset. */
  static byte[] read(LeaseRecord lease) throws IOException {
    Block b = lease.block();
    try (FileChannel f = FileChannel.open(Path.of(((IpcHandle.HostShm) b.memory().handle()).path()),
        StandardOpenOption.READ)) {
      ByteBuffer out = ByteBuffer.allocate((int) b.size());
      f.read(out, b.offset());
      return out.array();
    }
  }

  static byte[] write(LeaseRecord lease, long seed) throws IOException {
    Block b = lease.block();
    byte[] bytes = new byte[(int) b.size()];
    new Random(seed).nextBytes(bytes);
    try (FileChannel f = FileChannel.open(Path.of(((IpcHandle.HostShm) b.memory().handle()).path()),
        StandardOpenOption.WRITE)) {
      f.write(ByteBuffer.wrap(bytes), b.offset());
    }
    return bytes;
  }

  static List<Long> segments(LeaseRecord... leases) {
    return java.util.Arrays.stream(leases).map(l -> l.block().segmentId()).distinct().toList();
  }

  @Test
  void levelOne_freesTheDeviceMemory_andWakesEveryLeaseAtItsOffsetWithItsBytes() throws IOException {
    start(64 * MIB, 64 * MIB);
    Session s = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord weights = lease(s, 3 * MIB, "weights");
    LeaseRecord a = lease(s, 256 * 1024, "kv");
    LeaseRecord b = lease(s, 256 * 1024, "kv");
    byte[] w = write(weights, 1);
    byte[] ba = write(a, 2);
    byte[] bb = write(b, 3);
    long oldWeightsSegment = weights.block().segmentId();
    long[] offsets = {weights.block().offset(), a.block().offset(), b.block().offset()};
    long reserved = stat(PoolMetric.RESERVED_BYTES);

    SessionSleep.Slept slept = registry.sleep().sleep(Caller.DAEMON, s.id(), 1, List.of(), segments(weights, a, b));

    assertEquals(3, slept.leaseIds().size());
    assertEquals(weights.block().size() + a.block().size() + b.block().size(), slept.hostBytes());
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.RESERVED_BYTES), "every segment went back to the backend, none is cached");
    assertTrue(reserved > 0);
    assertEquals(slept.hostBytes(), registry.sleep().store().heldBytes());
    assertEquals(3, s.sleepFigures()[0]);
    assertNotNull(weights.asleep());
    ConflictException refused = assertThrows(ConflictException.class, () -> lease(s, MIB, ""));
    assertTrue(refused.getMessage().contains("asleep"), refused.getMessage());

    List<SessionSleep.Woken> woken = registry.sleep().wake(Caller.DAEMON, s.id());

    assertEquals(segments(weights, a, b).size(), woken.size());
    assertNull(weights.asleep());
    assertNotEquals(oldWeightsSegment, weights.block().segmentId(), "woken in a new segment");
    assertArrayEquals(offsets, new long[] {weights.block().offset(), a.block().offset(), b.block().offset()});
    assertArrayEquals(w, read(weights));
    assertArrayEquals(ba, read(a));
    assertArrayEquals(bb, read(b));
    assertEquals(0, registry.sleep().store().heldBytes());
    assertEquals(0, s.sleepFigures()[0]);
    assertNotNull(lease(s, MIB, ""), "awake, it leases again");
  }

  @Test
  void levelTwoWithTags_dropsTheTaggedContents_andKeepsTheOthersInTheSameSegment() throws IOException {
    start(64 * MIB, 64 * MIB);
    Session s = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord kv = lease(s, 256 * 1024, "kv");
    LeaseRecord weights = lease(s, 256 * 1024, "weights");
    LeaseRecord elsewhere = lease(s, 4 * MIB, "weights");
    assertEquals(kv.block().segmentId(), weights.block().segmentId(), "both small: one segment");
    write(kv, 4);
    byte[] w = write(weights, 5);
    byte[] e = write(elsewhere, 6);

    SessionSleep.Slept slept = registry.sleep().sleep(Caller.DAEMON, s.id(), 2, List.of("kv"), segments(kv));

    assertEquals(2, slept.leaseIds().size(), "the kv lease and the weights in its segment");
    assertEquals(weights.block().size(), slept.hostBytes(), "only the untagged lease's contents are kept");
    assertEquals(1, weights.asleep().level(), "kept at level 1, whatever the level asked");
    assertEquals(2, kv.asleep().level());
    assertNull(elsewhere.asleep(), "a segment without a kv lease stays awake");
    assertArrayEquals(e, read(elsewhere));

    registry.sleep().wake(Caller.DAEMON, s.id());

    assertArrayEquals(new byte[(int) kv.block().size()], read(kv), "level 2 wakes zeroed");
    assertArrayEquals(w, read(weights));
  }

  @Test
  void refusals_changeNothing() throws IOException {
    start(64 * MIB, 2 * MIB);
    Session s = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord small = lease(s, 256 * 1024, "");
    LeaseRecord big = lease(s, 4 * MIB, "");
    byte[] bytes = write(big, 7);
    long leased = stat(PoolMetric.LEASED_BYTES);

    InvalidRequestException notVacated = assertThrows(InvalidRequestException.class,
        () -> registry.sleep().sleep(Caller.DAEMON, s.id(), 1, List.of(), segments(small)));
    assertTrue(notVacated.getMessage().contains("[" + big.block().segmentId() + "]"), notVacated.getMessage());
    assertThrows(InvalidRequestException.class,
        () -> registry.sleep().sleep(Caller.DAEMON, s.id(), 3, List.of(), segments(small, big)));
    ExhaustedException overBound = assertThrows(ExhaustedException.class,
        () -> registry.sleep().sleep(Caller.DAEMON, s.id(), 1, List.of(), segments(small, big)));
    assertTrue(overBound.getMessage().contains("--offload-max-bytes"), overBound.getMessage());
    registry.sharing().publish(Caller.DAEMON, s.id(), small.id(), "weights", true);
    Session holder = registry.open(Caller.DAEMON, "holder", 0, -1);
    registry.sharing().lookup(Caller.DAEMON, holder.id(), "weights", "");
    ConflictException shared = assertThrows(ConflictException.class,
        () -> registry.sleep().sleep(Caller.DAEMON, s.id(), 2, List.of(), segments(small, big)));
    assertTrue(shared.getMessage().contains("'weights'") && shared.getMessage().contains(holder.toString()),
        shared.getMessage());

    assertNull(small.asleep());
    assertNull(big.asleep());
    assertEquals(leased, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, registry.sleep().store().heldBytes());
    assertArrayEquals(bytes, read(big));
    assertNotNull(lease(s, MIB, ""), "still awake: it leases");
  }

  @Test
  void freedMemoryServesAnotherSession_andWakeWaitsForNone_itRefuses() {
    start(4 * MIB, 64 * MIB);
    Session sleeper = registry.open(Caller.DAEMON, "sleeper", 0, -1);
    Session other = registry.open(Caller.DAEMON, "other", 0, -1);
    LeaseRecord held = lease(sleeper, 3 * MIB, "");
    assertThrows(ExhaustedException.class, () -> lease(other, 3 * MIB, ""), "the pool is full");

    registry.sleep().sleep(Caller.DAEMON, sleeper.id(), 1, List.of(), segments(held));
    assertNotNull(lease(other, 3 * MIB, ""), "the sleeper's memory serves another session");

    ExhaustedException full = assertThrows(ExhaustedException.class,
        () -> registry.sleep().wake(Caller.DAEMON, sleeper.id()));
    assertTrue(full.getMessage().contains("cannot wake"), full.getMessage());
    assertNotNull(held.asleep(), "still asleep after a refused wake");
    // Its segment stays mapped by the other session (cached) until that one ends.
    registry.close(Caller.DAEMON, other.id());
    registry.sleep().wake(Caller.DAEMON, sleeper.id());
    assertNull(held.asleep());
  }

  @Test
  void clientCachedLeases_nameNoSegment_andGoBackWhereTheirSegmentSleeps() {
    start(64 * MIB, 64 * MIB);
    Session s = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord inUse = lease(s, 256 * 1024, "");
    LeaseRecord cachedBeside = lease(s, 256 * 1024, "");
    LeaseRecord cachedAlone = lease(s, 4 * MIB, "");
    assertEquals(List.of(), registry.clientCache().cached(s, List.of(cachedBeside.id(), cachedAlone.id())));

    // The client vacated only the segment of the lease it still uses.
    SessionSleep.Slept slept = registry.sleep().sleep(Caller.DAEMON, s.id(), 1, List.of(), segments(inUse));

    assertEquals(List.of(inUse.id()), slept.leaseIds());
    assertEquals(2, registry.liveLeases(), "the cached lease beside it went back; the one alone stays cached");
    assertNull(cachedAlone.asleep());
    assertTrue(s.keepsCached(cachedAlone));
  }

  @Test
  void sleepRefusedForTheHostBound_leavesClientCachedLeasesCached() {
    start(64 * MIB, 2 * MIB);
    Session s = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord inUse = lease(s, 4 * MIB, "");
    LeaseRecord cachedBeside = lease(s, 256 * 1024, "");
    LeaseRecord smallInUse = lease(s, 256 * 1024, "");
    assertEquals(List.of(), registry.clientCache().cached(s, List.of(cachedBeside.id())));
    int live = registry.liveLeases();

    ExhaustedException overBound = assertThrows(ExhaustedException.class,
        () -> registry.sleep().sleep(Caller.DAEMON, s.id(), 1, List.of(), segments(inUse, smallInUse)));

    assertTrue(overBound.getMessage().contains("--offload-max-bytes"), overBound.getMessage());
    assertEquals(live, registry.liveLeases(), "a refused sleep gave no cached lease back");
    assertTrue(s.keepsCached(cachedBeside), "still in the client's tier, as before the call");
  }

  @Test
  void releaseOrEnd_whileAsleep_dropsTheContents() {
    start(64 * MIB, 64 * MIB);
    Session s = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord one = lease(s, MIB, "");
    LeaseRecord two = lease(s, 8 * MIB, "");
    registry.sleep().sleep(Caller.DAEMON, s.id(), 1, List.of(), segments(one, two));
    long held = registry.sleep().store().heldBytes();

    registry.release(Caller.DAEMON, s.id(), one.id(), new byte[0]);
    assertEquals(held - one.block().size(), registry.sleep().store().heldBytes());
    registry.close(Caller.DAEMON, s.id());

    assertEquals(0, registry.sleep().store().heldBytes());
    assertEquals(0, registry.liveLeases());
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertFalse(registry.sessions(Caller.DAEMON).contains(s));
  }
}
