package io.gpumemd.it.takeover;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Threads that lease, write, read back and close, in a loop, on one client: what a worker does
 * while its daemon is taken over. Records every failure (none is expected), every lease id (none
 * may repeat), and the longest single lease call.
 */
final class LeaseLoop implements AutoCloseable {
  private final GpuMemClient client;
  private final List<Thread> threads = new ArrayList<>();
  private final List<String> failures = new ArrayList<>();
  private final Set<String> ids = new HashSet<>();
  private final AtomicLong count = new AtomicLong();
  private final AtomicLong longestNanos = new AtomicLong();
  private volatile boolean stop;

  private LeaseLoop(GpuMemClient client) {
    this.client = client;
  }

  static LeaseLoop start(GpuMemClient client, int threads) {
    LeaseLoop loop = new LeaseLoop(client);
    for (int i = 0; i < threads; i++) {
      int n = i;
      Thread t = new Thread(() -> loop.run(n), "lease-loop-" + i);
      t.setDaemon(true);
      loop.threads.add(t);
      t.start();
    }
    return loop;
  }

  private void run(int n) {
    SplittableRandom random = new SplittableRandom(n);
    while (!stop) {
      long size = 4096L << random.nextInt(9); // 4 KiB .. 1 MiB
      int device = random.nextInt(2);
      byte value = (byte) random.nextInt(1, 127);
      long started = System.nanoTime();
      Lease lease;
      try {
        lease = client.lease(device, size);
      } catch (RuntimeException e) {
        fail("lease " + size + " on " + device + ": " + e);
        continue;
      }
      longestNanos.accumulateAndGet(System.nanoTime() - started, Math::max);
      try {
        ByteBuffer b = lease.buffer();
        b.put(0, value);
        b.put((int) size - 1, value);
        if (b.get(0) != value || b.get((int) size - 1) != value) {
          fail("bytes of " + lease + " changed under the writer");
        }
        if (!lease.localHit()) {
          synchronized (ids) {
            if (!ids.add(lease.id())) {
              fail("lease id " + lease.id() + " handed out twice");
            }
          }
        }
        lease.close();
        count.incrementAndGet();
      } catch (RuntimeException e) {
        fail("using " + lease + ": " + e);
      }
    }
  }

  private synchronized void fail(String what) {
    if (failures.size() < 20) {
      failures.add(what);
    }
  }

  long count() {
    return count.get();
  }

  /** Waits until {@code more} further leases went round. */
  void awaitMore(long more, long millis) throws InterruptedException {
    long target = count.get() + more;
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    while (count.get() < target && System.nanoTime() < deadline) {
      Thread.sleep(10);
    }
    if (count.get() < target) {
      throw new AssertionError("the loop is stuck at " + count.get() + " leases; failures: " + failures());
    }
  }

  synchronized List<String> failures() {
    return new ArrayList<>(failures);
  }

  long leases() {
    return count.get();
  }

  /** Daemon-served leases seen (each id once; a local hit reuses its lease's id by design). */
  long daemonServed() {
    synchronized (ids) {
      return ids.size();
    }
  }

  long longestMillis() {
    return TimeUnit.NANOSECONDS.toMillis(longestNanos.get());
  }

  void stopAndAwait() throws InterruptedException {
    stop = true;
    for (Thread t : threads) {
      t.join(30_000);
    }
  }

  @Override
  public void close() throws InterruptedException {
    stopAndAwait();
  }
}
