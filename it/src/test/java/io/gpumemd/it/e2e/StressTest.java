package io.gpumemd.it.e2e;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.pool.PoolMetric;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/**
 * 16 concurrent clients (14 threads with their own connections, 2 real processes) lease,
 * release, close their sessions, abandon them like a crash would, and get killed, for a bounded
 * time. Each verifies its own pattern in the memory it holds. Afterwards: no corruption, no
 * leased bytes, no sessions, no orphan files, pool invariants intact.
 */
class StressTest {
  private static final int THREADS = 14;
  private static final int PROCESSES = 2;
  private static final long RUN_MILLIS = 4000;

  private final AtomicLong corruptions = new AtomicLong();
  private final AtomicLong operations = new AtomicLong();

  private static void fill(ByteBuffer b, long pattern) {
    for (int i = 0; i + 8 <= b.capacity(); i += 512) {
      b.putLong(i, pattern);
    }
  }

  private static boolean intact(ByteBuffer b, long pattern) {
    for (int i = 0; i + 8 <= b.capacity(); i += 512) {
      if (b.getLong(i) != pattern) {
        return false;
      }
    }
    return true;
  }

  private record Held(Lease lease, long pattern) {}

  private void worker(TestDaemon daemon, int id, long deadline) {
    SplittableRandom random = new SplittableRandom(id * 7919L);
    GpuMemClient client = null;
    List<Held> held = new ArrayList<>();
    List<GpuMemClient> abandoned = new ArrayList<>();
    long counter = 0;
    try {
      while (System.nanoTime() < deadline) {
        if (client == null) {
          client = GpuMemClient.builder(random.nextBoolean() ? daemon.unixTarget() : daemon.tcpTarget())
              .clientName("stress-" + id).connect();
        }
        int op = random.nextInt(100);
        if (op < 50 || held.isEmpty()) {
          long size = random.nextBoolean() ? 512 + random.nextInt(64 * 1024) : 1 + random.nextInt(3 << 20);
          try {
            Lease lease = client.lease(random.nextInt(2), size, random.nextInt(10) == 0, "stress");
            long pattern = ((long) id << 40) | ++counter;
            fill(lease.buffer(), pattern);
            held.add(new Held(lease, pattern));
          } catch (GpuMemException e) {
            if (e.code() != Status.Code.RESOURCE_EXHAUSTED) {
              throw e;
            }
          }
        } else if (op < 92) {
          Held h = held.remove(random.nextInt(held.size()));
          if (!intact(h.lease.buffer(), h.pattern)) {
            corruptions.incrementAndGet();
          }
          h.lease.close();
        } else if (op < 97) {
          for (Held h : held) {
            if (!intact(h.lease.buffer(), h.pattern)) {
              corruptions.incrementAndGet();
            }
          }
          held.clear();
          client.close(); // CloseSession takes back what is still held
          client = null;
        } else {
          // A crash: the connection drops without CloseSession; the daemon ends the session
          // after the grace period.
          held.clear();
          client.connection().channel().shutdownNow();
          abandoned.add(client);
          client = null;
        }
        operations.incrementAndGet();
      }
    } finally {
      if (client != null) {
        client.close();
      }
      abandoned.forEach(GpuMemClient::close);
    }
  }

  @Test
  void sixteenClients_randomWork_noCorruption_nothingLeaked() throws Exception {
    // Sixteen threads and the holder processes, all one uid, close and reopen clients at random:
    // on a fast run more than the default 100 session opens a second (--session-open-rate has
    // tests of its own; here it would only refuse some workers' reconnects).
    try (TestDaemon daemon = TestDaemon.start("--keepalive-grace-ms", "300", "--session-open-rate", "0",
        "--host-segments", "path")) { // counts segment files
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RUN_MILLIS);
      ExecutorService pool = Executors.newFixedThreadPool(THREADS + PROCESSES);
      List<Future<?>> tasks = new ArrayList<>();
      for (int i = 0; i < THREADS; i++) {
        int id = i;
        tasks.add(pool.submit(() -> worker(daemon, id, deadline)));
      }
      AtomicLong kills = new AtomicLong();
      for (int p = 0; p < PROCESSES; p++) {
        int id = p;
        tasks.add(pool.submit(() -> {
          while (System.nanoTime() < deadline) {
            Process holder = ProcessKillTest.startHolder(daemon.unixTarget(), "stress-proc-" + id, 4, 100_000);
            try {
              ProcessKillTest.awaitReady(holder);
            } finally {
              holder.destroyForcibly();
              holder.waitFor(10, TimeUnit.SECONDS);
            }
            kills.incrementAndGet();
          }
          return null;
        }));
      }
      for (Future<?> task : tasks) {
        task.get(60, TimeUnit.SECONDS);
      }
      pool.shutdown();

      // Every session has ended or will within the grace period.
      long settle = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (daemon.server().registry().sessions(Caller.DAEMON).size() > 0 && System.nanoTime() < settle) {
        Thread.sleep(20);
      }
      assertEquals(0, corruptions.get(), "blocks seen with another holder's bytes");
      assertTrue(operations.get() > 100, "the workers did little: " + operations.get());
      assertTrue(kills.get() >= PROCESSES, "processes killed: " + kills.get());
      assertEquals(0, daemon.server().registry().sessions(Caller.DAEMON).size());
      assertEquals(0, daemon.server().registry().liveLeases());
      for (DevicePool pool1 : daemon.server().pools().all()) {
        pool1.verifyInvariants();
        PoolStats s = pool1.stats();
        assertEquals(0, s.get(PoolMetric.LEASED_BYTES), "device " + s.device());
        assertEquals(0, s.get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "segments of ended sessions are freed");
        assertEquals(s.get(PoolMetric.SEGMENTS), daemon.segmentFiles(s.device()), "one file per live segment, no orphans");
        pool1.trim(0);
        assertEquals(0, daemon.segmentFiles(s.device()));
      }
    }
  }
}
