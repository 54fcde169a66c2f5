package io.gpumemd.it.hardening;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.nio.ByteBuffer;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A well-behaved tenant (this JVM's uid) working through the client library beside the
 * attackers: leases of 4 KiB to 256 KiB on the session stream, each filled with a pattern of its
 * own, read back, and released, one after the other until {@link #close}. A lease not granted
 * within 5 s counts as a failure (the daemon missed the deadline), as does any refusal; a byte
 * that reads back wrong counts as a corruption. Thread-safe: one thread of its own works; any
 * thread reads the counts.
 */
final class Bystander implements AutoCloseable {
  private static final long DEADLINE_MS = 5000;

  private final GpuMemClient client;
  private final Thread thread;
  private final AtomicLong ops = new AtomicLong();
  private final AtomicLong failures = new AtomicLong();
  private final AtomicLong corruptions = new AtomicLong();
  private volatile String firstFailure = "";
  private volatile boolean running = true;

  Bystander(String target, String name) {
    client = GpuMemClient.builder(target).clientName(name).clientCacheBytes(0).connect();
    thread = new Thread(this::run, name);
    thread.setDaemon(true);
    thread.start();
  }

  private void run() {
    ThreadLocalRandom random = ThreadLocalRandom.current();
    while (running) {
      long size = 4096L << random.nextInt(7);
      byte seed = (byte) random.nextInt(1, 127);
      try (Lease lease = client.leaseAsync(0, size, false, "bystander").get(DEADLINE_MS, TimeUnit.MILLISECONDS)) {
        ByteBuffer bytes = lease.buffer();
        for (int i = 0; i < size; i += 512) {
          bytes.put(i, (byte) (seed + i / 512));
        }
        for (int i = 0; i < size; i += 512) {
          if (bytes.get(i) != (byte) (seed + i / 512)) {
            corruptions.incrementAndGet();
          }
        }
        ops.incrementAndGet();
      } catch (TimeoutException e) {
        failed("no lease within " + DEADLINE_MS + " ms");
      } catch (InterruptedException e) {
        return;
      } catch (Exception e) {
        failed(e.toString());
      }
      try {
        Thread.sleep(10);
      } catch (InterruptedException e) {
        return;
      }
    }
  }

  private void failed(String why) {
    if (failures.getAndIncrement() == 0) {
      firstFailure = why;
    }
  }

  long ops() {
    return ops.get();
  }

  long failures() {
    return failures.get();
  }

  long corruptions() {
    return corruptions.get();
  }

  String firstFailure() {
    return firstFailure;
  }

  @Override
  public String toString() {
    return ops() + " leases checked, " + failures() + " failed" + (firstFailure.isEmpty() ? "" : " (first: "
        + firstFailure + ")") + ", " + corruptions() + " corrupted bytes";
  }

  @Override
  public void close() throws InterruptedException {
    running = false;
    thread.join(DEADLINE_MS + 2000);
    client.close();
  }
}
