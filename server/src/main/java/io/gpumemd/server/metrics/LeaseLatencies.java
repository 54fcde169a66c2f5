package io.gpumemd.server.metrics;

import io.micrometer.core.instrument.Timer;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Lease latencies on their way to the lease-latency timers: a lease only writes its figure into
 * a ring here, and {@link #drain} records what the ring holds into the timers, on the thread
 * that calls it (housekeeping, or a scrape), not on a lease's.
 *
 * <p>Why: a timer with client-side percentiles records into time-window histograms that it
 * resets every 20 s (the expiry over its buffers), and the first figure into a reset or new
 * histogram resizes it. Measured: the first record on a new timer 1.4–1.9 ms, the first after a
 * reset 0.8–1.3 ms (a JVM that had recorded 200,000 figures before, so not the JIT); in a
 * successor that had just taken over, 1.7–10 ms on the first lease served, inside the
 * take-over's pause ({@code TakeOverPauseMain}, timestamped).
 *
 * <p>Bounded: {@value #CAPACITY} figures wait at most. A lease that finds the ring full drains
 * it itself, so no figure is lost and none waits unbounded. Each figure keeps its device, its
 * result and its nanoseconds (below 2^54: 208 days); a figure waits until the next drain, at
 * most a housekeeping round, so the percentiles' time window is late by that much.
 *
 * <p>Thread-safe: any number of leases record at once (a slot is claimed by compare-and-set on
 * the tail, then written); drains are serialised. A slot claimed but not yet written stops a
 * drain there, and the next drain takes it.
 */
final class LeaseLatencies {
  static final int CAPACITY = 4096;
  private static final int DEVICE_BITS = 8;

  private final Timer[][] timers;
  /** Encoded figures, 0 where free: written by a lease that claimed the slot, zeroed by a drain. */
  private final AtomicLongArray ring = new AtomicLongArray(CAPACITY);
  /** The next slot a lease claims; slots below {@link #head} are free again. */
  private final AtomicLong tail = new AtomicLong();
  /** The next slot a drain reads; written only by drains, under this monitor. */
  private volatile long head;

  /** @param timers per device ordinal, {miss, hit} */
  LeaseLatencies(Timer[][] timers) {
    if (timers.length > 1 << DEVICE_BITS) {
      throw new IllegalArgumentException("at most " + (1 << DEVICE_BITS) + " devices: " + timers.length);
    }
    this.timers = timers;
  }

  /** One served lease on {@code device}, a pool hit or not, that took {@code nanos}. */
  void record(int device, boolean hit, long nanos) {
    long figure = (Math.max(0, nanos) << (DEVICE_BITS + 1) | (long) device << 1 | (hit ? 1 : 0)) + 1;
    while (true) {
      long t = tail.get();
      if (t - head >= CAPACITY) {
        // Full: a drain makes room (and records the others' figures), then this one goes in.
        if (drain() == 0) {
          Thread.onSpinWait(); // the oldest slot is claimed and about to be written
        }
        continue;
      }
      if (tail.compareAndSet(t, t + 1)) {
        ring.set((int) (t % CAPACITY), figure);
        return;
      }
    }
  }

  /** Records every figure written so far into its timer; returns how many. */
  synchronized int drain() {
    long h = head;
    int n = 0;
    while (true) {
      int slot = (int) (h % CAPACITY);
      long figure = ring.get(slot);
      if (figure == 0) {
        break; // free, or claimed and not written yet
      }
      ring.set(slot, 0);
      h++;
      n++;
      long f = figure - 1;
      timers[(int) (f >>> 1) & ((1 << DEVICE_BITS) - 1)][(int) (f & 1)]
          .record(f >>> (DEVICE_BITS + 1), TimeUnit.NANOSECONDS);
    }
    head = h;
    return n;
  }
}
