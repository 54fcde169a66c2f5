package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Ticker;
import io.gpumemd.proto.takeover.v1.BlockState;
import io.gpumemd.proto.takeover.v1.PoolState;
import io.gpumemd.proto.takeover.v1.SegmentState;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.takeover.PoolStates;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A pool's snapshot and restore, through the take-over's wire message ({@link PoolStates}), on
 * the real host backend in descriptor mode: a pool with every kind of state is written down, its
 * descriptors pass through a real Unix socket, a pool on a new backend instance is restored from
 * them, and the old pool hands over. The restored pool
 * must be the same pool: same structure and figures, the same bytes, and it must go on leasing,
 * coalescing, evicting and asking the right holders to unmap. Plus every refusal.
 */
class DevicePoolTakeOverTest {
  private static final long KiB = 1024;
  private static final long MiB = 1024 * KiB;
  private static final long CAPACITY = 64 * MiB;
  private static final String FD_SOCKET = "/run/gpumemd/gpumemd.sock.fd";
  private static final SegmentOwner TENANT = SegmentOwner.of("uid:2000");

  @TempDir
  Path tmp;

  private final List<AutoCloseable> cleanup = new ArrayList<>();
  private HostShmBackend oldBackend;
  private DevicePool oldPool;
  private final RecordingHolders oldHolders = new RecordingHolders();

  @BeforeEach
  void createOldPool() {
    oldBackend = hostFdBackend("old");
    oldPool = pool(oldBackend, settings(CAPACITY), oldHolders);
  }

  @AfterEach
  void closeAll() throws Exception {
    for (int i = cleanup.size() - 1; i >= 0; i--) {
      cleanup.get(i).close();
    }
  }

  private HostShmBackend hostFdBackend(String name) {
    HostShmBackend backend = new HostShmBackend(tmp.resolve(name), 1, CAPACITY, null, FD_SOCKET);
    cleanup.add(backend);
    return backend;
  }

  private static PoolSettings settings(long limit) {
    return new PoolSettings(limit, limit, SizeClasses.DEFAULT_MAX_OVERSIZE, 0, limit);
  }

  private DevicePool pool(MemoryBackend backend, PoolSettings settings, HolderRequests holders) {
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, settings, holders,
        DevicePools.segmentIdBase(0), Ticker.system());
    cleanup.add(pool);
    return pool;
  }

  private DevicePool restore(MemoryBackend backend, PoolSettings settings, HolderRequests holders, PoolState state,
      int[] fds) throws SnapshotRefusedException {
    return restore(backend, settings, holders, state, IncomingSegments.of(backend, fds));
  }

  private DevicePool restore(MemoryBackend backend, PoolSettings settings, HolderRequests holders, PoolState state,
      IncomingSegments segments) throws SnapshotRefusedException {
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, settings, holders, DevicePools.segmentIdBase(0),
        Ticker.system());
    cleanup.add(pool);
    pool.restore(PoolStates.fromProto(state), segments);
    return pool;
  }

  /** A pool written down and put on the wire, as the take-over sends it. */
  private static PoolState export(DevicePool pool, SegmentFdSink sink) throws SnapshotRefusedException {
    return PoolStates.toProto(pool.snapshot(sink));
  }

  private static List<PoolState> exports(DevicePools pools, SegmentFdSink sink) throws SnapshotRefusedException {
    return pools.snapshots(sink).stream().map(PoolStates::toProto).toList();
  }

  private static List<PoolSnapshot> snapshots(List<PoolState> states) {
    return states.stream().map(PoolStates::fromProto).toList();
  }

  private DescriptorPassing passing(String name) throws Exception {
    DescriptorPassing passing = new DescriptorPassing(tmp.resolve(name + ".sock"));
    cleanup.add(passing);
    return passing;
  }

  private static Block lease(DevicePool pool, long bytes, String holder) {
    return lease(pool, bytes, holder, SegmentOwner.DAEMON);
  }

  private static Block lease(DevicePool pool, long bytes, String holder, SegmentOwner owner) {
    return pool.lease(bytes, false, holder, owner).block();
  }

  // ---------------------------------------------------------------------------- the bytes

  private static void write(Block block, byte[] bytes) throws Exception {
    try (SegmentFd d = ((FdPassedSegment) block.memory()).open(false);
        FileChannel channel = FileChannel.open(Path.of("/proc/self/fd/" + d.number()), StandardOpenOption.WRITE)) {
      ByteBuffer buffer = ByteBuffer.wrap(bytes);
      while (buffer.hasRemaining()) {
        channel.write(buffer, block.offset() + buffer.position());
      }
    }
  }

  private static byte[] read(Block block, int length) throws Exception {
    try (SegmentFd d = ((FdPassedSegment) block.memory()).open(true);
        FileChannel channel = FileChannel.open(Path.of("/proc/self/fd/" + d.number()), StandardOpenOption.READ)) {
      ByteBuffer buffer = ByteBuffer.allocate(length);
      while (buffer.hasRemaining()) {
        if (channel.read(buffer, block.offset() + buffer.position()) < 0) {
          throw new AssertionError("segment ends early");
        }
      }
      return buffer.array();
    }
  }

  private static byte[] pattern(int length, int seed) {
    byte[] bytes = new byte[length];
    for (int i = 0; i < length; i++) {
      bytes[i] = (byte) (i * 31 + seed);
    }
    return bytes;
  }

  /** The inode the descriptor number names now, or null when it is not open. */
  private static Object fileOf(int fd) {
    try {
      return Files.getAttribute(Path.of("/proc/self/fd/" + fd), "unix:ino");
    } catch (IOException e) {
      return null;
    }
  }

  /**
   * This JVM's open descriptors of segments (memfds named {@code gpumemd-seg-...}), not all of its
   * descriptors: other threads open and close theirs while a test counts (a count of every
   * descriptor was once one off under load).
   */
  private static long openDescriptors() throws Exception {
    try (Stream<Path> fds = Files.list(Path.of("/proc/self/fd"))) {
      return fds.filter(DevicePoolTakeOverTest::namesASegment).count();
    }
  }

  private static boolean namesASegment(Path fd) {
    try {
      return Files.readSymbolicLink(fd).toString().contains("gpumemd-seg-");
    } catch (java.io.IOException e) {
      return false; // closed since it was listed
    }
  }

  private static void assertSameStats(PoolStats expected, PoolStats actual) {
    for (PoolMetric m : PoolMetric.values()) {
      assertEquals(expected.get(m), actual.get(m), m.name());
    }
  }

  // ---------------------------------------------------------------------------- the state

  /** The blocks of the busy pool, by name. */
  private record Busy(Block a, Block b, Block c, Block g, Block d, long idleId, long awaitingId) {}

  /**
   * A pool with every kind of state: in segment S1 (small) leased blocks of two holders, a freed
   * block between them, a client-cached block and a free remainder; S2 (large) a leased block;
   * S3 idle, evicted by a lowered cap and awaiting holder s3's unmap; S4 (another owner) idle,
   * cached; shares, holds, names and client reports counted.
   */
  private Busy makeBusy(DevicePool pool) {
    Block a = lease(pool, 100 * KiB, "s1");
    Block b = lease(pool, 200 * KiB, "s1");
    Block c = lease(pool, 300 * KiB, "s2");
    Block g = lease(pool, 64 * KiB, "s1");
    pool.release(b, null);
    pool.clientCached(g, "s1");
    Block d = lease(pool, 3 * MiB, "s2");
    Block e = lease(pool, 5 * MiB, "s3");
    pool.release(e, null);
    Block f = lease(pool, 1536 * KiB, "s4", TENANT);
    pool.release(f, null);
    // LRU: S3 then S4. The cap keeps S4 and the client-cached block, so S3 goes, mapped by s3.
    assertEquals(6 * MiB, pool.setRetentionCap(2 * MiB + 64 * KiB));
    pool.blockShared(a);
    pool.shareMade();
    pool.shareMade();
    pool.attached(a, "s4");
    assertTrue(pool.publish(a));
    pool.publishedAgain();
    pool.addClientCounters(7, 3);
    pool.verifyInvariants();
    return new Busy(a, b, c, g, d, f.segmentId(), e.segmentId());
  }

  // ---------------------------------------------------------------------------- the take-over

  @Test
  void restoredPool_isTheSamePool_andGoesOn() throws Exception {
    Busy busy = makeBusy(oldPool);
    byte[] inA = pattern((int) (100 * KiB), 1);
    byte[] inD = pattern((int) MiB, 2);
    write(busy.a(), inA);
    write(busy.d(), inD);
    PoolStats before = oldPool.stats();
    assertEquals(1, before.get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(2, before.get(PoolMetric.PUBLISHED_OBJECTS));

    DescriptorPassing passing = passing("takeover");
    PoolState state = export(oldPool, passing);
    assertSameStats(before, oldPool.stats()); // exporting changes nothing
    assertEquals(4, state.getSegmentsCount());
    assertEquals(List.of(busy.idleId()), state.getIdleLruList());
    assertTrue(state.getRetentionCapSetAtRuntime());
    SegmentState awaiting = state.getSegmentsList().stream().filter(s -> s.getId() == busy.awaitingId()).findFirst()
        .orElseThrow();
    assertEquals(SegmentState.Lifecycle.AWAITING_UNMAP, awaiting.getState());
    assertEquals(List.of("s3"), awaiting.getMappersList());
    // The state survives its wire form.
    state = PoolState.parseFrom(state.toByteArray());

    HostShmBackend newBackend = hostFdBackend("new");
    RecordingHolders newHolders = new RecordingHolders();
    long beforeRestore = openDescriptors();
    DevicePool newPool = restore(newBackend, settings(CAPACITY), newHolders, state, passing.received());
    // Each received descriptor became the new backend's own: as many open as before.
    assertEquals(beforeRestore, openDescriptors());

    newPool.verifyInvariants();
    assertSameStats(before, newPool.stats());

    // The old daemon lets go: its descriptors close, the memory stays with the new one.
    long beforeHandOver = openDescriptors();
    oldPool.relinquish();
    oldPool.relinquish(); // idempotent
    assertEquals(beforeHandOver - 4, openDescriptors(), "the old pool's four segment descriptors are closed");
    assertNull(((FdPassedSegment) busy.a().memory()).open(false), "the old segment is no longer the old daemon's");
    assertThrows(IllegalStateException.class, () -> lease(oldPool, 4 * KiB, "s1"));

    Block a = newPool.blocksOf(busy.a().segmentId()).get(busy.a().offset());
    Block d = newPool.blocksOf(busy.d().segmentId()).get(busy.d().offset());
    assertNotNull(a);
    assertEquals(busy.a().size(), a.size());
    assertArrayEquals(inA, read(a, inA.length), "bytes written through the old pool read back through the new");
    assertArrayEquals(inD, read(d, inD.length));

    // A hit on a restored free block: b's old place, the best fit.
    LeasedBlock again = newPool.lease(200 * KiB, false, "s1", SegmentOwner.DAEMON);
    assertTrue(again.poolHit());
    assertEquals(busy.b().segmentId(), again.block().segmentId());
    assertEquals(busy.b().offset(), again.block().offset());
    // A release coalesces with a restored free neighbour: release b's lease again, then c.
    newPool.release(again.block(), null);
    Block c = newPool.blocksOf(busy.c().segmentId()).get(busy.c().offset());
    newPool.release(c, null);
    Block merged = newPool.blocksOf(busy.b().segmentId()).get(busy.b().offset());
    assertEquals(busy.b().size() + busy.c().size(), merged.size(), "b's free block and c coalesced");
    assertNull(newPool.blocksOf(busy.c().segmentId()).get(busy.c().offset()), "c's block is part of b's now");
    // The client-cached block is still its holder's.
    newPool.clientReused(newPool.blocksOf(busy.g().segmentId()).get(busy.g().offset()));
    newPool.verifyInvariants();

    // The awaiting-unmap segment waits for s3 and is freed through the new backend on its unmap.
    assertEquals(List.of(busy.awaitingId()), newPool.awaitingUnmapBy("s3"));
    long frees = newPool.stats().get(PoolMetric.BACKEND_FREES);
    newPool.unmapped("s3", busy.awaitingId());
    assertEquals(0, newPool.stats().get(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(frees + 1, newPool.stats().get(PoolMetric.BACKEND_FREES));
    // The idle segment is evicted under a lower cap, and its mapper s4 asked to unmap it.
    assertEquals(2 * MiB, newPool.setRetentionCap(0));
    assertEquals(List.of(new RecordingHolders.Request("unmap", "s4", 0, busy.idleId())),
        newHolders.requests("unmap"));
    // New segments go on from the old ids.
    Block fresh = lease(newPool, 8 * MiB, "s5");
    assertEquals(state.getNextSegmentId(), fresh.segmentId());
    newPool.verifyInvariants();
    assertArrayEquals(inA, read(a, inA.length));
  }

  @Test
  void restore_withTheTakersCapFlag_unlessTheCapWasSetAtRunTime() throws Exception {
    Block idle = lease(oldPool, 5 * MiB, "s1");
    oldPool.release(idle, null);
    DescriptorPassing passing = passing("cap");
    PoolState state = export(oldPool, passing);
    assertTrue(!state.getRetentionCapSetAtRuntime());
    // The taker's flag: a cap of 0 evicts the idle segment at once (nobody maps it: s1 is gone).
    oldPool.holderEnded("s1");
    state = export(oldPool, passing("cap2"));
    PoolSettings zeroCap = new PoolSettings(CAPACITY, 0, SizeClasses.DEFAULT_MAX_OVERSIZE, 0, CAPACITY);
    DevicePool restored = restore(hostFdBackend("new"), zeroCap, new RecordingHolders(), state,
        lastPassing().received());
    assertEquals(0, restored.stats().get(PoolMetric.CACHED_BYTES));
    assertEquals(0, restored.stats().get(PoolMetric.RETENTION_CAP_BYTES));
    restored.verifyInvariants();
  }

  private DescriptorPassing lastPassing() {
    for (int i = cleanup.size() - 1; i >= 0; i--) {
      if (cleanup.get(i) instanceof DescriptorPassing p) {
        return p;
      }
    }
    throw new AssertionError("no passing");
  }

  @Test
  void peak_isThePredecessors_evenWhenClientCachedAndLeasedBlocksTogetherExceedIt() throws Exception {
    Block cached = lease(oldPool, 3 * MiB, "s1");
    oldPool.clientCached(cached, "s1");
    lease(oldPool, 3 * MiB, "s1");
    PoolStats old = oldPool.stats();
    long peak = old.get(PoolMetric.PEAK_LEASED_BYTES);
    assertTrue(peak < old.get(PoolMetric.LEASED_BYTES) + old.get(PoolMetric.CLIENT_CACHED_BYTES),
        "never as much leased at once as is leased or client-cached now");
    DescriptorPassing passing = passing("peak");
    PoolState state = export(oldPool, passing);

    DevicePool restored = restore(hostFdBackend("new"), settings(CAPACITY), new RecordingHolders(), state,
        passing.received());
    assertEquals(peak, restored.stats().get(PoolMetric.PEAK_LEASED_BYTES));
    assertSameStats(oldPool.stats(), restored.stats());
  }

  @Test
  void devicePools_exportAndRestoreEveryDevice_throughOneSink() throws Exception {
    HostShmBackend twoOld = new HostShmBackend(tmp.resolve("two-old"), 2, CAPACITY, null, FD_SOCKET);
    cleanup.add(twoOld);
    List<DevicePool> list = new ArrayList<>();
    for (DeviceInfo device : twoOld.devices()) {
      DevicePool p = new DevicePool(device, twoOld, settings(CAPACITY), new RecordingHolders(),
          DevicePools.segmentIdBase(device.ordinal()), Ticker.system());
      list.add(p);
    }
    DevicePools olds = new DevicePools(list);
    cleanup.add(olds);
    Block zero = lease(olds.get(0), 100 * KiB, "s1");
    Block one = lease(olds.get(1), 3 * MiB, "s1");
    lease(olds.get(1), 100 * KiB, "s2");
    write(one, pattern(4096, 3));
    DescriptorPassing passing = passing("two");
    List<PoolState> states = exports(olds, passing);
    assertEquals(List.of(1, 2), states.stream().map(PoolState::getSegmentsCount).toList());
    assertEquals(3, passing.received().length, "indexes run on across devices");

    HostShmBackend twoNew = new HostShmBackend(tmp.resolve("two-new"), 2, CAPACITY, null, FD_SOCKET);
    cleanup.add(twoNew);
    DevicePools news = newPools(twoNew, settings(CAPACITY), settings(CAPACITY));
    cleanup.add(news);
    news.restore(snapshots(states), IncomingSegments.of(twoNew, passing.received()));
    for (int d = 0; d < 2; d++) {
      news.get(d).verifyInvariants();
      assertSameStats(olds.get(d).stats(), news.get(d).stats());
    }
    olds.relinquish();
    assertArrayEquals(pattern(4096, 3), read(news.get(1).blocksOf(one.segmentId()).get(one.offset()), 4096));
    assertEquals(zero.size(), news.ofSegment(zero.segmentId()).blocksOf(zero.segmentId()).get(zero.offset()).size());
  }

  @Test
  void devicePools_restore_refusedOnOneDevice_handsBackTheOthers() throws Exception {
    HostShmBackend twoOld = new HostShmBackend(tmp.resolve("two-old"), 2, CAPACITY, null, FD_SOCKET);
    cleanup.add(twoOld);
    List<DevicePool> list = new ArrayList<>();
    for (DeviceInfo device : twoOld.devices()) {
      list.add(new DevicePool(device, twoOld, settings(CAPACITY), new RecordingHolders(),
          DevicePools.segmentIdBase(device.ordinal()), Ticker.system()));
    }
    DevicePools olds = new DevicePools(list);
    cleanup.add(olds);
    lease(olds.get(0), 100 * KiB, "s1");
    lease(olds.get(1), 5 * MiB, "s1");
    HostShmBackend twoNew = new HostShmBackend(tmp.resolve("two-new"), 2, CAPACITY, null, FD_SOCKET);
    cleanup.add(twoNew);
    DescriptorPassing passing = passing("two");
    List<PoolState> states = exports(olds, passing);
    long beforeRestore = openDescriptors();

    DevicePools news = newPools(twoNew, settings(CAPACITY), settings(4 * MiB));
    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class,
        () -> news.restore(snapshots(states), IncomingSegments.of(twoNew, passing.received())));
    assertTrue(e.getMessage().startsWith("device 1: "), e.getMessage());
    assertEquals(beforeRestore - 2, openDescriptors(), "device 0's adopted segment handed back, device 1's closed");
    for (DevicePool p : olds.all()) {
      p.verifyInvariants();
    }
  }

  /** New pools of a successor, one per device of {@code backend}, with these settings. */
  @Test
  void aStateNamingOneDescriptorOnTwoDevices_isRefused_andNoSegmentIsAdoptedTwice() throws Exception {
    HostShmBackend twoOld = new HostShmBackend(tmp.resolve("two-old"), 2, CAPACITY, null, FD_SOCKET);
    cleanup.add(twoOld);
    DevicePools olds = newPools(twoOld, settings(CAPACITY), settings(CAPACITY));
    cleanup.add(olds);
    lease(olds.get(0), 3 * MiB, "s1");
    lease(olds.get(1), 3 * MiB, "s1");
    DescriptorPassing passing = passing("two");
    List<PoolState> states = new ArrayList<>(exports(olds, passing));
    assertEquals(2, passing.received().length);
    // Device 1's segment names device 0's descriptor: adopted twice, one memfd would be two segments.
    PoolState.Builder forged = states.get(1).toBuilder();
    forged.setSegments(0, forged.getSegments(0).toBuilder().setDescriptorIndex(0));
    states.set(1, forged.build());
    HostShmBackend twoNew = new HostShmBackend(tmp.resolve("two-new"), 2, CAPACITY, null, FD_SOCKET);
    cleanup.add(twoNew);
    DevicePools news = newPools(twoNew, settings(CAPACITY), settings(CAPACITY));
    long beforeRestore = openDescriptors();

    SnapshotRefusedException e;
    try (IncomingSegments segments = IncomingSegments.of(twoNew, passing.received())) {
      e = assertThrows(SnapshotRefusedException.class, () -> news.restore(snapshots(states), segments));
    }
    assertTrue(e.getMessage().startsWith("device 1: segment ") && e.getMessage().contains("names descriptor 0"),
        e.getMessage());
    assertEquals(beforeRestore - 2, openDescriptors(), "device 0's segment handed back, the unnamed one given up");
  }

  private static DevicePools newPools(HostShmBackend backend, PoolSettings... settings) {
    List<DevicePool> list = new ArrayList<>();
    for (DeviceInfo device : backend.devices()) {
      list.add(new DevicePool(device, backend, settings[device.ordinal()], new RecordingHolders(),
          DevicePools.segmentIdBase(device.ordinal()), Ticker.system()));
    }
    return new DevicePools(list);
  }

  // ---------------------------------------------------------------------------- refusals

  @Test
  void takeOverRefusal_ofASuccessorBudgetBelowTheSegmentsHeld_namesBothFigures() {
    Block block = lease(oldPool, 3 * MiB, "s1");
    long held = oldPool.stats().get(PoolMetric.RESERVED_BYTES);
    DevicePools pools = new DevicePools(List.of(oldPool));

    assertNull(oldPool.restoreRefusal(held));
    String refusal = pools.restoreRefusal(List.of(held - 1));
    assertTrue(refusal.contains("holds " + held + " bytes") && refusal.contains("budget is " + (held - 1)), refusal);
    assertTrue(pools.restoreRefusal(List.of(held, held)).contains("devices"));
    oldPool.release(block, null);
  }

  @Test
  void export_refused_whenABlockAwaitsItsCompletionEvent() throws Exception {
    Block block = lease(oldPool, 64 * KiB, "s1");
    oldPool.release(block, new NeverCompletes());
    DescriptorPassing passing = passing("event");

    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class, () -> export(oldPool, passing));
    assertTrue(e.getMessage().contains("completion events"), e.getMessage());
    assertEquals(0, passing.received().length, "nothing was sent");
  }

  @Test
  void export_refused_whileAnAllocationIsInFlight() throws Exception {
    StallingBackend stalling = new StallingBackend(oldBackend);
    DevicePool pool = pool(stalling, settings(CAPACITY), new RecordingHolders());
    CompletableFuture<Block> leasing = CompletableFuture.supplyAsync(() -> lease(pool, 4 * MiB, "s1"));
    try {
      assertTrue(stalling.entered.await(10, TimeUnit.SECONDS));
      SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class,
          () -> export(pool, passing("flight")));
      assertTrue(e.getMessage().contains("under way"), e.getMessage());
    } finally {
      stalling.proceed.countDown();
    }
    pool.release(leasing.get(10, TimeUnit.SECONDS), null);
    export(pool, passing("after")); // and once it has landed, the export goes through
  }

  @Test
  void export_refused_byAPathModeHostBackend_namingFdMode() throws Exception {
    HostShmBackend paths = new HostShmBackend(tmp.resolve("paths"), 1, CAPACITY, null);
    cleanup.add(paths);
    DevicePool pool = pool(paths, settings(CAPACITY), new RecordingHolders());
    lease(pool, 64 * KiB, "s1");

    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class, () -> export(pool, passing("p")));
    assertTrue(e.getMessage().contains("--host-segments fd"), e.getMessage());
    assertThrows(UnsupportedOperationException.class, () -> paths.adopt(0, -1, MiB));
  }

  @Test
  void export_refused_whenASegmentHasNoDescriptor() throws Exception {
    HostShmBackend paths = new HostShmBackend(tmp.resolve("paths"), 1, CAPACITY, null);
    cleanup.add(paths);
    // A backend that claims it can hand over, with segments on paths: the pool checks each.
    DevicePool pool = pool(new StallingBackend(paths, true), settings(CAPACITY), new RecordingHolders());
    lease(pool, 64 * KiB, "s1");

    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class, () -> export(pool, passing("n")));
    assertTrue(e.getMessage().contains("cannot be passed as a descriptor"), e.getMessage());
  }

  @Test
  void restore_refused_byATooSmallBudget_closesTheDescriptors_andTheOldPoolServesOn() throws Exception {
    Block block = lease(oldPool, 3 * MiB, "s1");
    byte[] bytes = pattern(4096, 9);
    write(block, bytes);
    HostShmBackend newBackend = hostFdBackend("new");
    DescriptorPassing passing = passing("small");
    PoolState state = export(oldPool, passing);
    long beforeRestore = openDescriptors();

    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class,
        () -> restore(newBackend, settings(2 * MiB), new RecordingHolders(), state, passing.received()));
    assertTrue(e.getMessage().contains("over this daemon's budget"), e.getMessage());
    assertEquals(beforeRestore - 1, openDescriptors(), "the received descriptor is closed");
    assertArrayEquals(bytes, read(block, bytes.length));
    oldPool.release(block, null);
    assertTrue(lease(oldPool, 3 * MiB, "s1") != null);
    oldPool.verifyInvariants();
  }

  @Test
  void restore_refused_byACorruptState_relinquishesWhatItAdopted() throws Exception {
    Block block = lease(oldPool, 100 * KiB, "s1");
    byte[] bytes = pattern(4096, 5);
    write(block, bytes);
    DescriptorPassing passing = passing("corrupt");
    PoolState good = export(oldPool, passing);
    // A gap between blocks: no pool has that.
    SegmentState.Builder segment = good.getSegments(0).toBuilder();
    BlockState last = segment.getBlocks(segment.getBlocksCount() - 1);
    segment.setBlocks(segment.getBlocksCount() - 1, last.toBuilder().setOffset(last.getOffset() + 512)
        .setSize(last.getSize() - 512));
    PoolState corrupt = good.toBuilder().setSegments(0, segment).build();
    HostShmBackend newBackend = hostFdBackend("new");
    long beforeRestore = openDescriptors();

    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class,
        () -> restore(newBackend, settings(CAPACITY), new RecordingHolders(), corrupt, passing.received()));
    assertTrue(e.getMessage().contains("gap or overlap"), e.getMessage());
    assertEquals(beforeRestore - 1, openDescriptors(), "the adopted segment is relinquished, its descriptor closed");
    assertArrayEquals(bytes, read(block, bytes.length), "the old pool's memory is untouched");
    oldPool.verifyInvariants();
  }

  /**
   * Where devices are hardware named by UUID (CUDA), the successor refuses a pool whose device is
   * another one than its own of that ordinal, whatever the holder checked: the memory of one GPU
   * is never served as another's. (Host devices match by ordinal: restoredPool_isTheSamePool
   * restores a pool of another directory, whose device UUID differs.)
   */
  @Test
  void restore_refused_whereDevicesMatchByUuid_andTheStateIsOfAnotherDevice() throws Exception {
    Block block = lease(oldPool, 3 * MiB, "s1");
    byte[] bytes = pattern(4096, 7);
    write(block, bytes);
    HostShmBackend newBackend = hostFdBackend("new");
    MemoryBackend byUuid = (MemoryBackend) java.lang.reflect.Proxy.newProxyInstance(
        MemoryBackend.class.getClassLoader(), new Class<?>[] {MemoryBackend.class}, (proxy, method, args) -> {
          if (method.getName().equals("devicesMatchByUuid")) {
            return true;
          }
          try {
            return method.invoke(newBackend, args);
          } catch (java.lang.reflect.InvocationTargetException e) {
            throw e.getCause();
          }
        });
    DescriptorPassing passing = passing("uuid");
    PoolState state = export(oldPool, passing);
    String oldUuid = oldBackend.devices().get(0).uuid();
    String newUuid = newBackend.devices().get(0).uuid();
    assertEquals(oldUuid, state.getDeviceUuid(), "the state names its device");
    int[] received = passing.received();
    assertEquals(1, received.length);
    Object receivedFile = fileOf(received[0]);

    SnapshotRefusedException e = assertThrows(SnapshotRefusedException.class,
        () -> restore(byUuid, settings(CAPACITY), new RecordingHolders(), state, received));
    assertTrue(e.getMessage().contains("device 0 is " + oldUuid) && e.getMessage().contains(newUuid)
        && e.getMessage().contains("CUDA_VISIBLE_DEVICES"), e.getMessage());
    // By the file the number named, not by a count of this JVM's descriptors, which other threads
    // open and close meanwhile: closed, or the number reused for another file.
    assertTrue(!receivedFile.equals(fileOf(received[0])), "the received descriptor is closed");
    assertArrayEquals(bytes, read(block, bytes.length));
    oldPool.verifyInvariants();
  }

  // ---------------------------------------------------------------------------- test parts

  /** A client's completion event that never completes (the host backend has none of its own). */
  private static final class NeverCompletes implements CompletionEvent {
    @Override
    public boolean isComplete() {
      return false;
    }

    @Override
    public void close() {}
  }

  /**
   * The host backend with its allocations held until the test lets them go, so that one is in
   * flight during an export; or ({@code claimsHandOver}) one that says it can hand over segments
   * it cannot pass as descriptors.
   */
  private static final class StallingBackend implements MemoryBackend {
    final CountDownLatch entered = new CountDownLatch(1);
    final CountDownLatch proceed = new CountDownLatch(1);
    private final MemoryBackend real;
    private final boolean claimsHandOver;

    StallingBackend(MemoryBackend real) {
      this(real, false);
    }

    StallingBackend(MemoryBackend real, boolean claimsHandOver) {
      this.real = real;
      this.claimsHandOver = claimsHandOver;
      if (claimsHandOver) {
        proceed.countDown();
      }
    }

    @Override
    public String name() {
      return real.name();
    }

    @Override
    public List<DeviceInfo> devices() {
      return real.devices();
    }

    @Override
    public SegmentMemory allocate(int device, long bytes, SegmentOwner owner) {
      entered.countDown();
      try {
        if (!proceed.await(10, TimeUnit.SECONDS)) {
          throw new AssertionError("never let go");
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      return real.allocate(device, bytes, owner);
    }

    @Override
    public void free(SegmentMemory segment) {
      real.free(segment);
    }

    @Override
    public void zero(SegmentMemory segment, long offset, long length) {
      real.zero(segment, offset, length);
    }

    @Override
    public boolean freshSegmentsAreZeroed() {
      return real.freshSegmentsAreZeroed();
    }

    @Override
    public boolean supportsCompletionEvents() {
      return false;
    }

    @Override
    public CompletionEvent openEvent(int device, byte[] ipcEventHandle) {
      return real.openEvent(device, ipcEventHandle);
    }

    @Override
    public String takeOverRefusal() {
      return claimsHandOver ? null : real.takeOverRefusal();
    }

    @Override
    public void close() {}
  }

  // ---------------------------------------------------------------------------- segments sent ahead

  /** The successor's side of segments sent ahead: each passed descriptor adopted, by index. */
  private static List<SegmentMemory> adoptAhead(MemoryBackend backend, List<SegmentAhead> ahead,
      DescriptorPassing passing, Map<SegmentMemory, Integer> sentAhead) {
    List<SegmentMemory> adopted = new ArrayList<>();
    for (SegmentAhead a : ahead) {
      int index = passing.add(a.memory(), a.descriptor()); // sent, and closed here
      sentAhead.put(a.memory(), index);
      adopted.add(backend.adopt(a.device(), passing.received()[index], a.bytes()));
    }
    return adopted;
  }

  /** A sink that names segments sent ahead by their index, and passes the others' descriptors after them. */
  private static SegmentFdSink after(Map<SegmentMemory, Integer> sentAhead, DescriptorPassing later) {
    return new SegmentFdSink() {
      @Override
      public int add(SegmentMemory memory, SegmentFd descriptor) {
        return sentAhead.size() + later.add(memory, descriptor);
      }

      @Override
      public int sentAhead(SegmentMemory memory) {
        return sentAhead.getOrDefault(memory, -1);
      }
    };
  }

  @Test
  void segmentsSentAhead_areTakenByTheRestore_onlyThoseMadeSincePassWithTheState_thoseFreedMeanwhileGivenUp()
      throws Exception {
    Block kept = lease(oldPool, 3 * MiB, "s1");
    Block gone = lease(oldPool, 5 * MiB, "s2");
    write(kept, pattern(4096, 7));
    HostShmBackend newBackend = hostFdBackend("new");
    long beforeAhead = openDescriptors();
    List<SegmentAhead> ahead = oldPool.segmentsAhead();
    assertEquals(2, ahead.size(), "both segments");
    Map<SegmentMemory, Integer> sentAhead = new IdentityHashMap<>();
    List<SegmentMemory> adopted = adoptAhead(newBackend, ahead, passing("ahead"), sentAhead);
    assertEquals(beforeAhead + 2, openDescriptors(), "each segment sent ahead is the new backend's too");

    // The old pool serves on meanwhile: one segment freed, one made.
    oldPool.release(gone, null);
    assertTrue(oldPool.trim(0) >= 5 * MiB, "the segment sent ahead is evicted");
    oldPool.unmapped("s2", gone.segmentId()); // its holder let go: freed
    Block made = lease(oldPool, 6 * MiB, "s3");
    DescriptorPassing later = passing("later");
    PoolState state = PoolState.parseFrom(export(oldPool, after(sentAhead, later)).toByteArray());
    assertEquals(1, later.received().length, "only the segment made since passes with the state");
    Map<Long, Integer> named = new java.util.HashMap<>();
    state.getSegmentsList().forEach(seg -> named.put(seg.getId(), seg.getDescriptorIndex()));
    assertEquals(Map.of(kept.segmentId(), sentAhead.get(kept.memory()), made.segmentId(), 2), named);

    long beforeRestore = openDescriptors();
    DevicePool newPool;
    try (IncomingSegments segments = new IncomingSegments(newBackend, adopted, later.received())) {
      newPool = restore(newBackend, settings(CAPACITY), new RecordingHolders(), state, segments);
    }
    assertEquals(beforeRestore - 1, openDescriptors(), "the segment freed meanwhile was given up, nothing else");
    newPool.verifyInvariants();
    assertSameStats(oldPool.stats(), newPool.stats());
    oldPool.relinquish();
    assertArrayEquals(pattern(4096, 7), read(newPool.blocksOf(kept.segmentId()).get(kept.offset()), 4096));
    assertEquals(made.size(), newPool.blocksOf(made.segmentId()).get(made.offset()).size());
  }

  @Test
  void aSegmentSentAheadThatIsNotTheOneTheStateNames_isRefused_andEverySegmentGivenUp() throws Exception {
    lease(oldPool, 3 * MiB, "s1");
    HostShmBackend newBackend = hostFdBackend("new");
    long beforeAhead = openDescriptors();
    Map<SegmentMemory, Integer> sentAhead = new IdentityHashMap<>();
    List<SegmentMemory> adopted = adoptAhead(newBackend, oldPool.segmentsAhead(), passing("ahead"), sentAhead);
    PoolState state = export(oldPool, after(sentAhead, passing("later")));
    // A state that names the segment sent ahead with another size.
    PoolState.Builder forged = state.toBuilder();
    SegmentState segment = forged.getSegments(0);
    forged.setSegments(0, segment.toBuilder().setBytes(segment.getBytes() * 2)
        .setBlocks(segment.getBlocksCount() - 1, segment.getBlocks(segment.getBlocksCount() - 1).toBuilder()
            .setSize(segment.getBlocks(segment.getBlocksCount() - 1).getSize() + segment.getBytes())));

    SnapshotRefusedException e;
    try (IncomingSegments segments = new IncomingSegments(newBackend, adopted, new int[0])) {
      e = assertThrows(SnapshotRefusedException.class,
          () -> restore(newBackend, settings(CAPACITY), new RecordingHolders(), forged.build(), segments));
    }
    assertTrue(e.getMessage().contains("sent ahead as descriptor 0") && e.getMessage().contains("expected: device 0's, "
        + segment.getBytes() * 2 + " bytes"), e.getMessage());
    assertEquals(beforeAhead, openDescriptors(), "the segment adopted ahead was given up");
    oldPool.verifyInvariants();
  }
}
