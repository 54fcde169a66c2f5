package io.gpumemd.server.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ExhaustedException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Queue;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Rules 1–3 of the README's "The rules that keep memory safe" under contention: worker threads, one holder each, two owners with two workers each
 * (a segment must only ever serve the workers of one owner), lease and release random sizes
 * (some zeroed, some released with completion events), trim and change the cap, while a poller
 * completes events. A shadow map, one owner slot per 512-byte granule of every segment, proves
 * that no byte is ever handed to two holders at once (rule 1) nor reused before its event
 * completed (rule 3); a hook on the backend's free proves no segment is freed while a holder
 * still has it mapped (rule 2). Then the usual invariants and counter identities.
 */
class DevicePoolConcurrencyTest extends PoolTestBase {
  private static final int WORKERS = 4;
  private static final int ITERATIONS = 20_000;
  private static final int MAX_HELD = 8;
  private static final long SEED = 0x5eed_9a11L;
  private static final List<SegmentOwner> OWNERS = List.of(SegmentOwner.of("tenant-a"), SegmentOwner.of("tenant-b"));

  /** Owner (worker number + 1, 0 = nobody) of every 512-byte granule, per segment id. */
  private final Map<Long, AtomicLongArray> shadow = new ConcurrentHashMap<>();
  private final List<String> violations = new CopyOnWriteArrayList<>();
  private final List<Set<SegmentMemory>> mapped = new ArrayList<>();
  private final List<Queue<Long>> unmapRequests = new ArrayList<>();
  private final List<ShadowEvent> events = new CopyOnWriteArrayList<>();
  private final AtomicLong exhausted = new AtomicLong();
  /** The owner each segment first served; segment ids are never reused. */
  private final Map<Long, SegmentOwner> segmentOwners = new ConcurrentHashMap<>();

  @Test
  @Timeout(value = 120, unit = TimeUnit.SECONDS)
  void randomLeaseAndRelease_neverHandsABlockToTwoHolders() throws Exception {
    InMemoryBackend memory = new InMemoryBackend(1, 256 * MiB, false).recordZeroCalls(false);
    use(new CheckedPool(memory, new PoolSettings(96 * MiB, 8 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE), false));
    for (int w = 0; w < WORKERS; w++) {
      mapped.add(ConcurrentHashMap.newKeySet());
      unmapRequests.add(new ConcurrentLinkedQueue<>());
    }
    checked.onUnmapRequest((holder, device, segmentId) ->
        unmapRequests.get(workerOf(holder)).add(segmentId));
    backend.onFree(this::checkNothingMapsOrHolds);

    AtomicBoolean polling = new AtomicBoolean(true);
    ExecutorService threads = Executors.newFixedThreadPool(WORKERS + 1);
    CountDownLatch start = new CountDownLatch(1);
    try {
      Future<?> poller = threads.submit(() -> {
        start.await();
        while (polling.get()) {
          pool.pollEvents();
          Thread.onSpinWait();
        }
        return null;
      });
      List<Future<?>> workers = new ArrayList<>();
      for (int w = 0; w < WORKERS; w++) {
        int worker = w;
        workers.add(threads.submit(() -> {
          start.await();
          work(worker, new SplittableRandom(SEED + worker));
          return null;
        }));
      }
      start.countDown();
      for (Future<?> f : workers) {
        f.get(100, TimeUnit.SECONDS);
      }
      polling.set(false);
      poller.get(10, TimeUnit.SECONDS);
    } finally {
      threads.shutdownNow();
    }

    // Settle: let every pending event complete, then answer every unmap request.
    while ((pool.stats().get(PoolMetric.BLOCKS_AWAITING_EVENT) > 0)) {
      pool.pollEvents();
    }
    for (int w = 0; w < WORKERS; w++) {
      answerUnmapRequests(w);
    }

    assertEquals(List.of(), violations);
    PoolStats s = stats();
    System.out.println("concurrency run: " + s + ", refused leases=" + exhausted + ", events=" + events.size());
    assertEquals(0, s.get(PoolMetric.ACTIVE_LEASES));
    assertEquals(0, s.get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "every unmap request was answered");
    assertEquals(0, s.get(PoolMetric.AWAITING_EVENT_BYTES));
    assertTrue(events.stream().allMatch(e -> e.closed.get()), "every event was closed");
    // The run exercised what it claims to.
    assertTrue(s.get(PoolMetric.HITS) > 0 && s.get(PoolMetric.MISSES) > 0, s.toString());
    assertTrue(s.get(PoolMetric.EVICTIONS) > 0, s.toString());
    assertTrue(s.get(PoolMetric.RETURNS) > 0, s.toString());
    assertFalse(events.isEmpty());
    for (AtomicLongArray owners : shadow.values()) {
      for (int g = 0; g < owners.length(); g++) {
        assertEquals(0, owners.get(g), "granule still claimed after everything was released");
      }
    }
  }

  private void work(int worker, SplittableRandom random) {
    String holder = "worker-" + worker;
    SegmentOwner owner = OWNERS.get(worker % OWNERS.size());
    long me = worker + 1;
    List<Block> held = new ArrayList<>();
    for (int i = 0; i < ITERATIONS; i++) {
      answerUnmapRequests(worker);
      int dice = random.nextInt(1000);
      if (dice == 0) {
        pool.trim(random.nextLong(8 * MiB));
      } else if (dice == 1) {
        pool.setRetentionCap(random.nextLong(16 * MiB));
      } else if (held.size() < MAX_HELD && (held.isEmpty() || random.nextInt(100) < 55)) {
        long size = random.nextInt(10) == 0
            ? MiB + random.nextLong(5 * MiB) // large
            : 1 + random.nextLong(256 * KiB); // small
        Block block;
        try {
          block = random.nextInt(20) == 0
              ? checked.tryLeaseCached(size, holder, owner)
              : checked.lease(size, random.nextInt(10) == 0, holder, owner);
        } catch (ExhaustedException e) {
          exhausted.incrementAndGet();
          continue;
        }
        if (block == null) {
          continue;
        }
        if (block.size() < size) {
          violations.add(holder + " got " + block + " for " + size + " bytes");
        }
        SegmentOwner first = segmentOwners.putIfAbsent(block.segmentId(), owner);
        if (first != null && !first.equals(owner)) {
          violations.add(holder + " of " + owner + " got " + block + " of a segment that served " + first);
        }
        mapped.get(worker).add(block.memory());
        claim(block, me, holder);
        held.add(block);
      } else if (!held.isEmpty()) {
        Block block = held.remove(random.nextInt(held.size()));
        if (random.nextInt(5) == 0) {
          // Rule 3: the bytes stay ours until the event completes; the pool polls it.
          ShadowEvent event = new ShadowEvent(block, me, 1 + random.nextInt(4));
          events.add(event);
          checked.release(block, event);
        } else {
          unclaim(block, me);
          checked.release(block);
        }
      }
    }
    for (Block block : held) {
      unclaim(block, me);
      checked.release(block);
    }
  }

  private void answerUnmapRequests(int worker) {
    Long segmentId;
    while ((segmentId = unmapRequests.get(worker).poll()) != null) {
      long id = segmentId;
      mapped.get(worker).removeIf(m -> segmentIdOf(m) == id);
      pool.unmapped("worker-" + worker, id);
    }
  }

  private final Map<SegmentMemory, Long> segmentIds = new ConcurrentHashMap<>();

  private long segmentIdOf(SegmentMemory memory) {
    Long id = segmentIds.get(memory);
    return id == null ? -1 : id;
  }

  private void claim(Block block, long me, String holder) {
    segmentIds.put(block.memory(), block.segmentId());
    AtomicLongArray owners = shadow.computeIfAbsent(block.segmentId(),
        id -> new AtomicLongArray((int) (block.segmentBytes() / SizeClasses.ALIGNMENT)));
    int from = (int) (block.offset() / SizeClasses.ALIGNMENT);
    int to = (int) ((block.offset() + block.size()) / SizeClasses.ALIGNMENT);
    for (int g = from; g < to; g++) {
      if (!owners.compareAndSet(g, 0, me)) {
        violations.add(holder + " was handed " + block + " but granule " + g + " is held by worker-"
            + (owners.get(g) - 1));
        return;
      }
    }
  }

  private void unclaim(Block block, long me) {
    AtomicLongArray owners = shadow.get(block.segmentId());
    int from = (int) (block.offset() / SizeClasses.ALIGNMENT);
    int to = (int) ((block.offset() + block.size()) / SizeClasses.ALIGNMENT);
    for (int g = from; g < to; g++) {
      if (!owners.compareAndSet(g, me, 0)) {
        violations.add("worker-" + (me - 1) + " released " + block + " but granule " + g
            + " was held by " + owners.get(g));
        return;
      }
    }
  }

  /** Backend free hook: nobody may still map the segment or hold bytes of it. */
  private void checkNothingMapsOrHolds(SegmentMemory memory) {
    for (int w = 0; w < WORKERS; w++) {
      if (mapped.get(w).contains(memory)) {
        violations.add("segment " + segmentIdOf(memory) + " freed while worker-" + w + " maps it");
      }
    }
    AtomicLongArray owners = shadow.get(segmentIdOf(memory));
    if (owners != null) {
      for (int g = 0; g < owners.length(); g++) {
        if (owners.get(g) != 0) {
          violations.add("segment " + segmentIdOf(memory) + " freed while granule " + g + " is held");
          return;
        }
      }
    }
  }

  private static int workerOf(String holder) {
    return Integer.parseInt(holder.substring("worker-".length()));
  }

  /**
   * Completes after a few queries; at completion it gives the block's bytes back in the shadow
   * map, before the pool can hand them out again.
   */
  private final class ShadowEvent implements CompletionEvent {
    private final Block block;
    private final long owner;
    private final AtomicLong queriesLeft;
    private final AtomicBoolean done = new AtomicBoolean();
    final AtomicBoolean closed = new AtomicBoolean();

    ShadowEvent(Block block, long owner, int queries) {
      this.block = block;
      this.owner = owner;
      this.queriesLeft = new AtomicLong(queries);
    }

    @Override
    public boolean isComplete() {
      if (done.get()) {
        return true;
      }
      if (queriesLeft.decrementAndGet() > 0) {
        return false;
      }
      if (done.compareAndSet(false, true)) {
        // The block waits for this event, so its range cannot change before we return.
        unclaim(block, owner);
      }
      return true;
    }

    @Override
    public void close() {
      closed.set(true);
    }
  }
}
