package io.gpumemd.server.sharing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
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
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Parking of published objects over a real host-backend pool (segments are shared-memory files,
 * read and written here as a client would): the bytes a later lookup sees, the memory freed
 * meanwhile, and the refusals that change nothing.
 */
class ObjectParkingTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;

  private void start(long poolBytes, long offloadMaxBytes) {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(poolBytes, poolBytes, 20 * MIB, 50), sessions, DevicePools.segmentIdBase(0),
        Ticker.system());
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of()),
        Ticker.system(), sessions, offloadMaxBytes);
  }

  @AfterEach
  void verifyAndClose() {
    if (pools != null) {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  private long stat(PoolMetric metric) {
    return pools.get(0).stats().get(metric);
  }

  private SharedObjects sharing() {
    return registry.sharing();
  }

  private PublishedObject object(String name) {
    return sharing().objects(Caller.DAEMON, null, null, 100).items().stream().filter(o -> o.name().equals(name))
        .findFirst().orElseThrow();
  }

  /** A lease of {@code bytes}, filled with random bytes, published as {@code name}; the session ends. */
  private byte[] publishAndLeave(String name, long bytes, long seed) throws IOException {
    Session s = registry.open(Caller.DAEMON, "loader", 0, -1);
    LeaseRecord lease = registry.lease(Caller.DAEMON, s.id(), 0, bytes, false, "weights", false);
    byte[] written = write(lease, seed);
    sharing().publish(Caller.DAEMON, s.id(), lease.id(), name, true);
    registry.close(Caller.DAEMON, s.id());
    return written;
  }

  private static byte[] read(Block b) throws IOException {
    try (FileChannel f = FileChannel.open(Path.of(((IpcHandle.HostShm) b.memory().handle()).path()),
        StandardOpenOption.READ)) {
      ByteBuffer out = ByteBuffer.allocate((int) b.size());
      f.read(out, b.offset());
      return out.array();
    }
  }

  private static byte[] write(LeaseRecord lease, long seed) throws IOException {
    Block b = lease.block();
    byte[] bytes = new byte[(int) b.size()];
    new Random(seed).nextBytes(bytes);
    try (FileChannel f = FileChannel.open(Path.of(((IpcHandle.HostShm) b.memory().handle()).path()),
        StandardOpenOption.WRITE)) {
      f.write(ByteBuffer.wrap(bytes), b.offset());
    }
    return bytes;
  }

  @Test
  void park_freesTheDeviceMemory_andALookupByAnotherSessionGetsTheSameBytes() throws IOException {
    start(64 * MIB, 64 * MIB);
    byte[] weights = publishAndLeave("weights", 3 * MIB, 7);
    long oldSegment = object("weights").shared().block().segmentId();
    long size = object("weights").shared().block().size();

    ObjectParking.Parked parked = sharing().park(Caller.DAEMON, "", "weights");

    assertEquals(size, parked.hostBytes());
    assertEquals(size, parked.freedBytes());
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.RESERVED_BYTES), "its segment, unused and unmapped, went back to the backend");
    assertEquals(0, stat(PoolMetric.PUBLISHED_BYTES));
    assertEquals(size, registry.sleep().store().heldBytes());
    assertEquals(1, registry.sleep().store().parks());
    assertTrue(object("weights").shared().parked());
    assertEquals(List.of("'weights' of tenant " + Caller.DAEMON.tenant()), sharing().parkedObjects());
    assertEquals(0, sharing().park(Caller.DAEMON, "", "weights").freedBytes(), "parked already: nothing changes");

    Session engine = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord hold = sharing().lookup(Caller.DAEMON, engine.id(), "weights", "");

    assertArrayEquals(weights, read(hold.block()));
    assertNotEquals(oldSegment, hold.block().segmentId(), "restored into a new block");
    assertFalse(object("weights").shared().parked());
    assertEquals(0, registry.sleep().store().heldBytes(), "the parked bytes were dropped");
    assertEquals(1, registry.sleep().store().restores());
    assertEquals(size, stat(PoolMetric.PUBLISHED_BYTES));
    assertEquals(size, stat(PoolMetric.LEASED_BYTES));
    assertTrue(sharing().parkedObjects().isEmpty());
  }

  @Test
  void park_whileASessionHoldsIt_isRefusedNamingTheHolder_andChangesNothing() throws IOException {
    start(64 * MIB, 64 * MIB);
    byte[] weights = publishAndLeave("weights", MIB, 3);
    Session engine = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord hold = sharing().lookup(Caller.DAEMON, engine.id(), "weights", "");
    long leased = stat(PoolMetric.LEASED_BYTES);

    ConflictException refused = assertThrows(ConflictException.class,
        () -> sharing().park(Caller.DAEMON, "", "weights"));

    assertTrue(refused.getMessage().contains(engine.id().substring(0, 8)), refused.getMessage());
    assertTrue(refused.getMessage().contains(hold.id()), refused.getMessage());
    assertFalse(object("weights").shared().parked());
    assertEquals(leased, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, registry.sleep().store().heldBytes());
    assertArrayEquals(weights, read(hold.block()));

    registry.release(Caller.DAEMON, engine.id(), hold.id(), new byte[0]);
    assertEquals(hold.block().size(), sharing().park(Caller.DAEMON, "", "weights").freedBytes(),
        "parks once the hold is gone");
  }

  @Test
  void park_whileAShareTokenHoldsIt_isRefusedNamingTheToken() throws IOException {
    start(64 * MIB, 64 * MIB);
    Session s = registry.open(Caller.DAEMON, "loader", 0, -1);
    LeaseRecord lease = registry.lease(Caller.DAEMON, s.id(), 0, MIB, false, "", false);
    sharing().publish(Caller.DAEMON, s.id(), lease.id(), "weights", false);
    sharing().share(Caller.DAEMON, s.id(), lease.id(), 60, false, 0);
    registry.release(Caller.DAEMON, s.id(), lease.id(), new byte[0]);

    ConflictException refused = assertThrows(ConflictException.class,
        () -> sharing().park(Caller.DAEMON, "", "weights"));

    assertTrue(refused.getMessage().contains("1 share token"), refused.getMessage());
    assertFalse(object("weights").shared().parked());
  }

  @Test
  void park_overTheHostBound_isRefusedNamingTheFlag_andChangesNothing() throws IOException {
    start(64 * MIB, 2 * MIB);
    byte[] weights = publishAndLeave("weights", 3 * MIB, 5);
    long reserved = stat(PoolMetric.RESERVED_BYTES);
    long published = stat(PoolMetric.PUBLISHED_BYTES);

    ExhaustedException refused = assertThrows(ExhaustedException.class,
        () -> sharing().park(Caller.DAEMON, "", "weights"));

    assertTrue(refused.getMessage().contains("--offload-max-bytes"), refused.getMessage());
    assertTrue(refused.getMessage().contains("'weights'"), refused.getMessage());
    assertFalse(object("weights").shared().parked());
    assertEquals(reserved, stat(PoolMetric.RESERVED_BYTES));
    assertEquals(published, stat(PoolMetric.PUBLISHED_BYTES));
    assertEquals(0, registry.sleep().store().heldBytes());
    assertArrayEquals(weights, read(object("weights").shared().block()));
  }

  @Test
  void unpublish_ofAParkedObject_dropsItsHostBytes_andItsQuota() throws IOException {
    start(64 * MIB, 64 * MIB);
    publishAndLeave("weights", 2 * MIB, 1);
    sharing().park(Caller.DAEMON, "", "weights");
    assertEquals(2 * MIB, registry.sleep().store().heldBytes());

    assertTrue(sharing().remove(Caller.DAEMON, "", "weights"), "its last hold is gone");

    assertEquals(0, registry.sleep().store().heldBytes());
    assertEquals(0, registry.tenant(Caller.DAEMON.tenant()).holdings()[1], "the tenant's quota no longer carries it");
    assertTrue(sharing().allObjects().isEmpty());
    assertEquals(0, stat(PoolMetric.PUBLISHED_OBJECTS));
  }

  @Test
  void concurrentLookups_ofAParkedObject_restoreItOnce() throws Exception {
    start(64 * MIB, 64 * MIB);
    byte[] weights = publishAndLeave("weights", 4 * MIB, 9);
    sharing().park(Caller.DAEMON, "", "weights");
    List<Session> engines = new ArrayList<>();
    for (int i = 0; i < 4; i++) {
      engines.add(registry.open(Caller.DAEMON, "engine" + i, 0, -1));
    }
    ExecutorService pool = Executors.newFixedThreadPool(4);
    try {
      List<Future<LeaseRecord>> holds = new ArrayList<>();
      for (Session e : engines) {
        holds.add(pool.submit(() -> sharing().lookup(Caller.DAEMON, e.id(), "weights", "")));
      }
      Block first = holds.get(0).get().block();
      for (Future<LeaseRecord> h : holds) {
        assertEquals(first.segmentId(), h.get().block().segmentId());
        assertEquals(first.offset(), h.get().block().offset());
      }
      assertArrayEquals(weights, read(first));
    } finally {
      pool.shutdown();
    }
    assertEquals(1, registry.sleep().store().restores());
    assertEquals(weights.length, stat(PoolMetric.LEASED_BYTES), "one block for all four");
  }

  @Test
  void parkIdleObjects_letsALeaseSucceedThatWouldBeRefused_parkingTheLeastRecentlyLookedUp() throws IOException {
    start(8 * MIB, 64 * MIB);
    byte[] old = publishAndLeave("old", 4 * MIB, 1);
    publishAndLeave("recent", 4 * MIB, 2);
    Session engine = registry.open(Caller.DAEMON, "engine", 0, -1);
    LeaseRecord look = sharing().lookup(Caller.DAEMON, engine.id(), "recent", "");
    registry.release(Caller.DAEMON, engine.id(), look.id(), new byte[0]);
    assertThrows(ExhaustedException.class, () -> registry.lease(Caller.DAEMON, engine.id(), 0, 4 * MIB, false, "", false),
        "without --park-idle-objects the pool is full");

    sharing().parkIdleObjectsWhenShort();
    LeaseRecord kv = registry.lease(Caller.DAEMON, engine.id(), 0, 4 * MIB, false, "kv", false);

    assertTrue(object("old").shared().parked(), "the least recently looked up was parked");
    assertFalse(object("recent").shared().parked());
    assertEquals(4 * MIB, registry.sleep().store().heldBytes());
    assertEquals(8 * MIB, stat(PoolMetric.LEASED_BYTES));
    registry.release(Caller.DAEMON, engine.id(), kv.id(), new byte[0]);
    assertArrayEquals(old, read(sharing().lookup(Caller.DAEMON, engine.id(), "old", "").block()),
        "and comes back with its bytes");
  }

  @Test
  void parkIdleObjects_neverParksAHeldObject_andTheLeaseIsRefusedAsBefore() throws IOException {
    start(8 * MIB, 64 * MIB);
    publishAndLeave("weights", 4 * MIB, 1);
    Session engine = registry.open(Caller.DAEMON, "engine", 0, -1);
    sharing().lookup(Caller.DAEMON, engine.id(), "weights", "");
    registry.lease(Caller.DAEMON, engine.id(), 0, 4 * MIB, false, "", false);
    sharing().parkIdleObjectsWhenShort();

    assertThrows(ExhaustedException.class, () -> registry.lease(Caller.DAEMON, engine.id(), 0, 4 * MIB, false, "", false));

    assertFalse(object("weights").shared().parked());
    assertEquals(0, registry.sleep().store().parks());
  }
}
