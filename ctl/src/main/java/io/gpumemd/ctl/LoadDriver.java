package io.gpumemd.ctl;

import io.gpumemd.client.GpuMemException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.HdrHistogram.Histogram;

/**
 * Runs an operation under load and measures it: sequentially on the calling thread, from
 * several threads at once, or as a fixed number of asynchronous chains. Each run warms up
 * first (samples discarded), then records every operation that starts inside the measured
 * window into an HdrHistogram (nanoseconds, 3 significant digits).
 *
 * <p>Each thread or chain records into its own histogram, merged at the end: recording costs
 * a few nanoseconds and no synchronisation, so the tool does not perturb what it measures.
 * The first error stops the run; it is reported with the result, not thrown.
 */
final class LoadDriver {
  private LoadDriver() {}

  /** One operation; returns false for a lease that was not a pool hit (true otherwise). */
  interface Op {
    boolean run() throws Exception;
  }

  /** An asynchronous operation; its future completes with the same meaning as {@link Op}. */
  interface AsyncOp {
    CompletableFuture<Boolean> start();
  }

  /** Called between warm-up and measurement (a child process waits there for its parent). */
  interface Gate {
    void await() throws Exception;
  }

  /** Warm-up and measurement durations. */
  record Timing(long warmupNanos, long measureNanos) {
    static Timing ofSeconds(double warmup, double measure) {
      return new Timing((long) (warmup * 1e9), Math.max(1, (long) (measure * 1e9)));
    }
  }

  static Histogram newHistogram() {
    return new Histogram(3); // auto-resizing: no sample is ever out of range
  }

  static String describe(Throwable t) {
    Throwable cause = t;
    while ((cause instanceof java.util.concurrent.CompletionException
        || cause instanceof java.util.concurrent.ExecutionException) && cause.getCause() != null) {
      cause = cause.getCause();
    }
    return cause instanceof GpuMemException g ? g.getMessage() : cause.toString();
  }

  /** An operation that times the part of itself worth measuring, in nanoseconds. */
  interface TimedOp {
    long run() throws Exception;
  }

  /**
   * Op after op on the calling thread, each recording the nanoseconds it reports: for a case
   * whose set-up (a lease before the close being measured) must not count.
   */
  static LoadResult sequentialTimed(String scenario, String label, Timing timing, Map<String, Object> details,
      TimedOp op) {
    Histogram histogram = newHistogram();
    long start = System.nanoTime();
    long now = start;
    try {
      warmUp(timing, op::run);
      start = System.nanoTime();
      long end = start + timing.measureNanos();
      do {
        histogram.recordValue(Math.max(1, op.run()));
        now = System.nanoTime();
      } while (now < end);
    } catch (Exception e) {
      return new LoadResult(scenario, label, histogram.getTotalCount(), now - start, histogram, -1, 1, describe(e),
          details);
    }
    return new LoadResult(scenario, label, histogram.getTotalCount(), now - start, histogram, -1, 0, null, details);
  }

  /** Op after op on the calling thread; every op of the window is one sample. */
  static LoadResult sequential(String scenario, String label, Timing timing, boolean leases, Map<String, Object> details,
      Op op) {
    Histogram histogram = newHistogram();
    long misses = 0;
    long start = System.nanoTime();
    long t0 = start;
    try {
      warmUp(timing, op::run);
      start = System.nanoTime();
      long end = start + timing.measureNanos();
      t0 = start;
      do {
        boolean hit = op.run();
        long t1 = System.nanoTime();
        histogram.recordValue(t1 - t0);
        if (!hit) {
          misses++;
        }
        t0 = t1;
      } while (t0 < end);
    } catch (Exception e) {
      return new LoadResult(scenario, label, histogram.getTotalCount(), t0 - start, histogram,
          leases ? misses : -1, 1, describe(e), details);
    }
    return new LoadResult(scenario, label, histogram.getTotalCount(), t0 - start, histogram, leases ? misses : -1,
        0, null, details);
  }

  /** Runs {@code op} again and again for the warm-up time. */
  private static void warmUp(Timing timing, Callable<?> op) throws Exception {
    long warmEnd = System.nanoTime() + timing.warmupNanos();
    while (System.nanoTime() < warmEnd) {
      op.call();
    }
  }

  /**
   * {@code threads} threads call the same (thread-safe) op in a loop. They warm up for the
   * warm-up time and until each has completed one op (at most {@link #FIRST_OP_WAIT_SECONDS}
   * more), then {@code gate} is passed, then all measure for the same window. Only ops that start
   * in the window count: a thread still in its first, cold op (a fresh JVM's connection, class
   * loading, compiling) when a short window opens would otherwise count nothing in it.
   */
  static LoadResult threaded(String scenario, String label, int threads, Timing timing, boolean leases,
      Map<String, Object> details, Op op, Gate gate) {
    Window window = new Window(threads);
    List<Runner> runners = new ArrayList<>();
    for (int i = 0; i < threads; i++) {
      Runner runner = new Runner(op, window);
      runners.add(runner);
      Thread t = new Thread(runner, "loadgen-" + scenario + "-" + i);
      t.setDaemon(true);
      runner.thread = t;
      t.start();
    }
    String gateError = null;
    try {
      Thread.sleep(TimeUnit.NANOSECONDS.toMillis(timing.warmupNanos()));
      window.firstOps.await(FIRST_OP_WAIT_SECONDS, TimeUnit.SECONDS);
      gate.await();
    } catch (Exception e) {
      gateError = describe(e);
    }
    long start = System.nanoTime();
    window.end = gateError != null ? start : start + timing.measureNanos();
    window.start = start; // volatile write after end: a runner that sees start sees end
    Histogram merged = newHistogram();
    long misses = 0;
    long errors = gateError == null ? 0 : 1;
    String firstError = gateError;
    long lastEnd = start;
    for (Runner runner : runners) {
      try {
        runner.thread.join();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        window.abort = true;
      }
      merged.add(runner.histogram);
      misses += runner.misses;
      lastEnd = Math.max(lastEnd, runner.lastEnd);
      if (runner.error != null) {
        errors++;
        firstError = firstError == null ? runner.error : firstError;
      }
    }
    return new LoadResult(scenario, label, merged.getTotalCount(), lastEnd - start, merged, leases ? misses : -1,
        errors, firstError, details);
  }

  /** The most a threaded case waits, after its warm-up, for every thread's first op. */
  static final long FIRST_OP_WAIT_SECONDS = 60;

  /** The measured window shared by the runners; Long.MAX_VALUE until it opens. */
  private static final class Window {
    /** Counted down by each runner once its first op ended (or it stopped). */
    final CountDownLatch firstOps;
    volatile long start = Long.MAX_VALUE;
    volatile long end = Long.MAX_VALUE;
    volatile boolean abort;

    Window(int threads) {
      firstOps = new CountDownLatch(threads);
    }
  }

  private static final class Runner implements Runnable {
    final Op op;
    final Window window;
    final Histogram histogram = newHistogram();
    Thread thread;
    long misses;
    long lastEnd = Long.MIN_VALUE;
    String error;
    private boolean counted;

    Runner(Op op, Window window) {
      this.op = op;
      this.window = window;
    }

    @Override
    public void run() {
      long t0 = System.nanoTime();
      try {
        while (!window.abort) {
          boolean hit = op.run();
          long t1 = System.nanoTime();
          if (!counted) {
            counted = true;
            window.firstOps.countDown();
          }
          long start = window.start;
          if (t0 >= start) {
            histogram.recordValue(t1 - t0);
            lastEnd = t1;
            if (!hit) {
              misses++;
            }
          }
          if (t1 >= window.end) {
            return;
          }
          t0 = t1;
        }
      } catch (Exception e) {
        error = describe(e);
        window.abort = true;
      } finally {
        if (!counted) {
          window.firstOps.countDown(); // a runner that stops before its first op must not hold the others
        }
      }
    }
  }

  /**
   * {@code inFlight} chains, each starting its next operation when the previous completes,
   * so exactly that many are outstanding. Completions run on the transport thread.
   */
  static LoadResult async(String scenario, String label, int inFlight, Timing timing, boolean leases,
      Map<String, Object> details, AsyncOp op) throws InterruptedException {
    long measureStart = System.nanoTime() + timing.warmupNanos();
    long measureEnd = measureStart + timing.measureNanos();
    CountDownLatch done = new CountDownLatch(inFlight);
    List<Chain> chains = new ArrayList<>();
    for (int i = 0; i < inFlight; i++) {
      chains.add(new Chain(op, measureStart, measureEnd, done));
    }
    chains.forEach(Chain::next);
    long waitNanos = timing.warmupNanos() + timing.measureNanos() + TimeUnit.SECONDS.toNanos(30);
    boolean finished = done.await(waitNanos, TimeUnit.NANOSECONDS);
    Histogram merged = newHistogram();
    long misses = 0;
    long errors = finished ? 0 : 1;
    String firstError = finished ? null : "chains still running 30 s after the window closed";
    long lastEnd = measureStart;
    for (Chain chain : chains) {
      synchronized (chain) {
        merged.add(chain.histogram);
        misses += chain.misses;
        lastEnd = Math.max(lastEnd, chain.lastEnd);
        if (chain.error != null) {
          errors++;
          firstError = firstError == null ? chain.error : firstError;
        }
      }
    }
    return new LoadResult(scenario, label, merged.getTotalCount(), lastEnd - measureStart, merged,
        leases ? misses : -1, errors, firstError, details);
  }

  /**
   * One sequence of async operations. Its callbacks run one after another; the (uncontended)
   * monitor only makes its counters safe to read should the controller give up waiting.
   */
  private static final class Chain {
    final AsyncOp op;
    final long measureStart;
    final long measureEnd;
    final CountDownLatch done;
    final Histogram histogram = newHistogram();
    long misses;
    long lastEnd = Long.MIN_VALUE;
    String error;

    Chain(AsyncOp op, long measureStart, long measureEnd, CountDownLatch done) {
      this.op = op;
      this.measureStart = measureStart;
      this.measureEnd = measureEnd;
      this.done = done;
    }

    void next() {
      long t0 = System.nanoTime();
      CompletableFuture<Boolean> future;
      try {
        future = op.start();
      } catch (RuntimeException e) {
        finish(describe(e));
        return;
      }
      future.whenComplete((hit, failure) -> {
        long t1 = System.nanoTime();
        if (failure != null) {
          finish(describe(failure));
          return;
        }
        synchronized (this) {
          if (t0 >= measureStart) {
            histogram.recordValue(t1 - t0);
            lastEnd = t1;
            if (!hit) {
              misses++;
            }
          }
        }
        if (t1 >= measureEnd) {
          done.countDown();
        } else {
          next();
        }
      });
    }

    private synchronized void finish(String failure) {
      error = failure;
      done.countDown();
    }
  }
}
