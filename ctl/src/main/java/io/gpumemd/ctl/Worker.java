package io.gpumemd.ctl;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.common.Sizes;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * {@code gpumemctl worker}: the example worker of the docker-compose setup. Opens a session,
 * then per iteration leases {@code --size} bytes on {@code --device}, writes a pattern over the
 * whole block, reads it back, holds the lease {@code --hold-ms} and releases it, logging one
 * line. Runs {@code --iterations} times (0 = until stopped).
 *
 * <p>{@link #stop} (called by the SIGTERM/SIGINT handler) ends the run after the current
 * iteration's lease is released, cutting the hold short; the session is then closed and the
 * process exits 0. On a CUDA device the pattern goes through device copies ({@link CudaPattern}).
 *
 * <p>Across a daemon restart the worker keeps going: the iteration whose lease died with the old
 * session, or that found the daemon away, is logged and retried, on a new session.
 *
 * <p>Runs on the calling thread; {@link #stop} may be called from any thread.
 */
@Command(name = "worker",
    description = {"example worker: lease, write and verify a pattern, hold, release",
        "Per iteration: leases --size bytes on --device, writes a pattern over the whole block, reads it "
            + "back, holds the lease --hold-ms and releases it. SIGTERM ends the run after the current "
            + "lease is released."})
final class Worker implements Callable<Integer>, GpuMemCtl.Validated {
  private final GpuMemCtl ctl;
  private final CountDownLatch stopped = new CountDownLatch(1);

  @Option(names = "--device", paramLabel = "N", description = "device to lease on (default: ${DEFAULT-VALUE})")
  private int device;

  @Option(names = "--size", paramLabel = "SIZE", converter = Converters.Size.class, defaultValue = "16MiB",
      description = "bytes per lease, below 2 GiB (default: ${DEFAULT-VALUE})")
  private long sizeBytes;

  @Option(names = "--hold-ms", paramLabel = "MS", defaultValue = "100",
      description = "how long each lease is held (default: ${DEFAULT-VALUE})")
  private long holdMillis;

  @Option(names = "--iterations", paramLabel = "N", description = "leases to take; 0 = until stopped (default: ${DEFAULT-VALUE})")
  private long iterations;

  @Option(names = "--name", paramLabel = "NAME", description = "the session's client name (default: gpumemctl-worker-PID)")
  private String name;

  Worker(GpuMemCtl ctl) {
    this.ctl = ctl;
  }

  @Override
  public void validate(GpuMemCtl.Problems problems) {
    if (sizeBytes <= 0 || sizeBytes > Integer.MAX_VALUE) {
      problems.add("--size", Sizes.label(sizeBytes), "a size in [1, 2 GiB)");
    }
    if (device < 0) {
      problems.add("--device", device, "an integer in [0, " + Integer.MAX_VALUE + "]");
    }
    if (holdMillis < 0) {
      problems.add("--hold-ms", holdMillis, "an integer in [0, " + Long.MAX_VALUE + "]");
    }
    if (iterations < 0) {
      problems.add("--iterations", iterations, "an integer in [0, " + Long.MAX_VALUE + "] (0: forever)");
    }
  }

  @Override
  public Integer call() {
    if (name == null) {
      name = "gpumemctl-worker-" + ProcessHandle.current().pid();
    }
    if (ctl.ownsProcess()) {
      stopOnTermination(this);
    }
    return run();
  }

  /** Makes SIGTERM and SIGINT call {@link #stop} instead of ending the JVM at once. */
  static void stopOnTermination(Worker worker) {
    for (String signal : new String[] {"TERM", "INT"}) {
      try {
        sun.misc.Signal.handle(new sun.misc.Signal(signal), s -> worker.stop());
      } catch (IllegalArgumentException e) {
        // signal not available here; the JVM's default handling stays
      }
    }
  }

  /** Ends the run after the current iteration; returns at once. */
  void stop() {
    stopped.countDown();
  }

  private boolean stopping() {
    return stopped.getCount() == 0;
  }

  /** @return the exit code: 0 when all iterations passed or the worker was stopped */
  int run() {
    log("starting: target " + ctl.target() + ", device " + device + ", " + Sizes.format(sizeBytes) + " per lease, hold "
        + holdMillis + " ms, " + (iterations == 0 ? "until stopped" : iterations + " iteration(s)"));
    long done = 0;
    try (GpuMemClient client = ctl.connect(name)) {
      while ((iterations == 0 || done < iterations) && !stopping()) {
        try {
          iterate(client, done + 1);
          done++;
        } catch (GpuMemException e) {
          if (e.code() != Status.Code.UNAVAILABLE) {
            throw e;
          }
          // The daemon is away (restarting, or draining before it exits): the client opens a
          // new session once it is back. Pause a little so that a drain is not a busy loop.
          log("iteration " + (done + 1) + ": " + e.getMessage() + "; retrying");
          pause();
        } catch (IllegalStateException e) {
          if (!client.sessionLost() && !String.valueOf(e.getMessage()).contains("session lost")) {
            throw e;
          }
          log("iteration " + (done + 1) + ": " + e.getMessage() + "; retrying");
        }
      }
    }
    log("stopped after " + done + " iteration(s)" + (stopping() ? " (signal)" : ""));
    return 0;
  }

  /** Waits 100 ms before a retry, or less when the worker is stopped meanwhile. */
  private void pause() {
    try {
      stopped.await(100, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      stop();
    }
  }

  private void iterate(GpuMemClient client, long iteration) {
    long start = System.nanoTime();
    String leaseId;
    boolean hit;
    long verifyNanos;
    try (Lease lease = client.lease(device, sizeBytes, false, "worker")) {
      leaseId = lease.id();
      hit = lease.poolHit();
      long seed = ProcessHandle.current().pid() * 0x9E3779B97F4A7C15L + iteration;
      long t0 = System.nanoTime();
      if (lease.isHost()) {
        ByteBuffer memory = lease.buffer();
        writePattern(memory, seed);
        verifyPattern(memory, seed, lease);
      } else {
        CudaPattern.writeAndVerify(lease, seed); // device copies through the IPC mapping
      }
      verifyNanos = System.nanoTime() - t0;
      if (holdMillis > 0) {
        try {
          stopped.await(holdMillis, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          stop();
        }
      }
    }
    log(String.format(Locale.ROOT, "iteration %d: lease %s, %s on device %d (%s), pattern verified in %.1f ms, "
            + "released after %.1f ms", iteration, leaseId, Sizes.format(sizeBytes), device, hit ? "pool hit" : "miss",
        verifyNanos / 1e6, (System.nanoTime() - start) / 1e6));
  }

  /** The pattern's 64-bit word number {@code index} (written big-endian, as ByteBuffer does). */
  static long patternAt(long seed, long index) {
    long x = seed + index * 0xBF58476D1CE4E5B9L;
    return x ^ (x >>> 31);
  }

  static void writePattern(ByteBuffer memory, long seed) {
    int longs = memory.capacity() / 8;
    for (int i = 0; i < longs; i++) {
      memory.putLong(i * 8, patternAt(seed, i));
    }
    for (int i = longs * 8; i < memory.capacity(); i++) {
      memory.put(i, (byte) seed);
    }
  }

  private static void verifyPattern(ByteBuffer memory, long seed, Lease lease) {
    int longs = memory.capacity() / 8;
    for (int i = 0; i < longs; i++) {
      if (memory.getLong(i * 8) != patternAt(seed, i)) {
        throw new GpuMemException(Status.Code.DATA_LOSS, "pattern mismatch at offset " + (i * 8L) + " of " + lease
            + ": another holder wrote to this block", null);
      }
    }
    for (int i = longs * 8; i < memory.capacity(); i++) {
      if (memory.get(i) != (byte) seed) {
        throw new GpuMemException(Status.Code.DATA_LOSS, "pattern mismatch at offset " + i + " of " + lease, null);
      }
    }
  }

  private void log(String line) {
    ctl.out().println(Instant.now().truncatedTo(ChronoUnit.MILLIS) + " worker: " + line);
    ctl.out().flush();
  }
}
