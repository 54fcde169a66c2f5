package io.gpumemd.server.sharing;

import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.SharedBlock;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.GpumemdException;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.FakeTicker;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Share, attach, lookup, publish, unpublish, revoke, release and session ends racing from eight
 * threads over one pool. Every thread checks the pool's invariants after each of its steps;
 * between rounds, with all threads parked at a barrier, the books of the holds are checked
 * against the pool's: every block held by a live record, token or name is leased, counted once,
 * and its hold count is exactly its records plus tokens plus names. At the end, with every
 * session closed and every token and name dropped, the pool is back to zero.
 */
class SharingConcurrencyTest {
  private static final long MIB = 1 << 20;
  private static final Caller TENANT = new Caller("uid:1000", "uid 1000", false, 1000, 1000, 7, "pid 7");
  private static final int THREADS = 8;
  private static final int ROUNDS = 20;
  private static final int STEPS = 150;
  private static final byte[] NO_EVENT = new byte[0];

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private final List<String> tokens = new CopyOnWriteArrayList<>();
  private final AtomicLong refusals = new AtomicLong();
  private final AtomicLong attaches = new AtomicLong();

  @AfterEach
  void close() {
    if (pools != null) {
      pools.close();
      backend.close();
    }
  }

  @Test
  void racingSharesAttachesAndReleases_keepTheBooks() throws Exception {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 256 * MIB, null);
    LiveSessions live = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(256 * MIB, 256 * MIB, 20 * MIB, 0, 64 * MIB), live, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, SessionSettings.defaults().withSharing(SharingSettings.DEFAULTS),
        ticker, live);
    CyclicBarrier barrier = new CyclicBarrier(THREADS + 1);
    ExecutorService threads = Executors.newFixedThreadPool(THREADS);
    List<Future<?>> done = new ArrayList<>();
    for (int t = 0; t < THREADS; t++) {
      int id = t;
      done.add(threads.submit(() -> {
        worker(id, barrier);
        return null;
      }));
    }
    for (int round = 0; round < ROUNDS; round++) {
      barrier.await(60, TimeUnit.SECONDS); // all parked: check the books
      checkBooks();
      barrier.await(60, TimeUnit.SECONDS);
    }
    for (Future<?> f : done) {
      f.get(60, TimeUnit.SECONDS);
    }
    threads.shutdown();
    assertTrue(attaches.get() > 100, "attaches happened: " + attaches.get());

    for (Session s : registry.sessions(Caller.DAEMON)) {
      registry.close(Caller.DAEMON, s.id());
    }
    registry.sharing().dropAll("test end");
    pool.verifyInvariants();
    PoolStats stats = pool.stats();
    assertEquals(0, stats.get(PoolMetric.LEASED_BYTES), stats.toString());
    assertEquals(0, stats.get(PoolMetric.ACTIVE_LEASES));
    assertEquals(0, stats.get(PoolMetric.SHARED_BLOCKS));
    assertEquals(0, stats.get(PoolMetric.LIVE_HOLDS));
    assertEquals(0, registry.tenant(TENANT.tenant()).holds(), "every hold gave its tenant's place back");
    assertEquals(0, stats.get(PoolMetric.PUBLISHED_OBJECTS));
    assertEquals(0, stats.get(PoolMetric.PUBLISHED_BYTES));
    // A hold taken and at once undone (its token used up by another thread meanwhile, its
    // session closed) counts as taken: the counter may exceed the successful attaches by those.
    long counted = stats.get(PoolMetric.ATTACHES);
    assertTrue(counted >= attaches.get() && counted <= attaches.get() + refusals.get(),
        counted + " attaches counted, " + attaches.get() + " succeeded, " + refusals.get() + " refused");
  }

  private void worker(int id, CyclicBarrier barrier) throws Exception {
    SplittableRandom random = new SplittableRandom(id * 31L + 7);
    SharedObjects sharing = registry.sharing();
    Session session = registry.open(TENANT, "w" + id, 30, 0);
    List<LeaseRecord> mine = new ArrayList<>();
    for (int round = 0; round < ROUNDS; round++) {
      for (int step = 0; step < STEPS; step++) {
        try {
          switch (random.nextInt(10)) {
            case 0, 1 -> mine.add(registry.lease(TENANT, session.id(), 0, 512 + random.nextInt(256 * 1024), false, "",
                false));
            case 2 -> {
              if (!mine.isEmpty()) {
                LeaseRecord l = mine.get(random.nextInt(mine.size()));
                tokens.add(sharing.share(TENANT, session.id(), l.id(), 0, random.nextBoolean(),
                    random.nextInt(3)).token());
              }
            }
            case 3, 4 -> {
              if (!tokens.isEmpty()) {
                mine.add(sharing.attach(TENANT, session.id(), tokens.get(random.nextInt(tokens.size())), ""));
                attaches.incrementAndGet();
              }
            }
            case 5 -> {
              if (!mine.isEmpty()) {
                LeaseRecord l = mine.get(random.nextInt(mine.size()));
                sharing.publish(TENANT, session.id(), l.id(), "obj-" + random.nextInt(16), false);
              }
            }
            case 6 -> {
              mine.add(sharing.lookup(TENANT, session.id(), "obj-" + random.nextInt(16), ""));
              attaches.incrementAndGet();
            }
            case 7 -> {
              if (random.nextBoolean()) {
                sharing.unpublish(TENANT, session.id(), "obj-" + random.nextInt(16));
              } else if (!tokens.isEmpty()) {
                sharing.revoke(TENANT, session.id(), tokens.remove(random.nextInt(tokens.size())));
              }
            }
            case 8 -> {
              if (!mine.isEmpty()) {
                LeaseRecord l = mine.remove(random.nextInt(mine.size()));
                registry.release(TENANT, session.id(), l.id(), NO_EVENT);
              }
            }
            default -> {
              if (random.nextInt(8) == 0) {
                registry.close(TENANT, session.id());
                mine.clear();
                session = registry.open(TENANT, "w" + id, 30, 0);
              }
            }
          }
        } catch (GpumemdException | IndexOutOfBoundsException e) {
          // NOT_FOUND (a token used up or revoked by another thread, a name unpublished),
          // ALREADY_EXISTS, RESOURCE_EXHAUSTED: refused, changing nothing; the books say so.
          refusals.incrementAndGet();
        }
        pools.get(0).verifyInvariants();
      }
      barrier.await(60, TimeUnit.SECONDS);
      barrier.await(60, TimeUnit.SECONDS);
    }
  }

  /** With every worker parked: the holds agree with the pool, block by block. */
  private void checkBooks() {
    DevicePool pool = pools.get(0);
    pool.verifyInvariants();
    Map<Block, Integer> records = new IdentityHashMap<>();
    Map<Block, SharedBlock> shared = new IdentityHashMap<>();
    for (LeaseRecord r : registry.leases(Caller.DAEMON, null, "")) {
      records.merge(r.block(), 1, Integer::sum);
      if (r.shared() != null) {
        shared.put(r.block(), r.shared());
      }
    }
    Map<Block, Integer> others = new HashMap<>();
    for (SharedBlock s : registry.sharing().heldByTokensAndNames()) {
      others.merge(s.block(), 1, Integer::sum);
      shared.put(s.block(), s);
    }
    long bytes = 0;
    java.util.Set<Block> blocks = java.util.Collections.newSetFromMap(new IdentityHashMap<>());
    blocks.addAll(records.keySet());
    blocks.addAll(others.keySet());
    for (Block b : blocks) {
      bytes += b.size();
      SharedBlock s = shared.get(b);
      int expected = records.getOrDefault(b, 0) + others.getOrDefault(b, 0);
      if (s != null) {
        assertEquals(expected, s.holds(), "holds of " + b);
      } else {
        assertEquals(1, expected, "an unshared block has one record: " + b);
      }
    }
    PoolStats stats = pool.stats();
    assertEquals(bytes, stats.get(PoolMetric.LEASED_BYTES), "leased bytes = distinct held blocks");
    assertEquals(blocks.size(), stats.get(PoolMetric.ACTIVE_LEASES));
    long attachedRecords = registry.leases(Caller.DAEMON, null, "").stream().filter(LeaseRecord::attached).count();
    assertEquals(attachedRecords, stats.get(PoolMetric.LIVE_HOLDS));
    assertEquals(attachedRecords, registry.tenant(TENANT.tenant()).holds(),
        "the tenant's count of holds (--max-holds-per-tenant) agrees with its sessions' holds");
  }
}
