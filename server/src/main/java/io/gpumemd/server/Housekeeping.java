package io.gpumemd.server;

import io.gpumemd.server.fd.DescriptorPins;
import io.gpumemd.server.grpc.StreamWatchdog;
import io.gpumemd.server.metrics.ServerMetrics;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.SessionRegistry;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import io.gpumemd.server.takeover.HandOverGate;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The daemon's timers, on one thread: every 100 ms the session reaper (grace periods, TTLs,
 * leak warnings), the stream watchdog (streams whose client stopped reading), the lease
 * latencies' way into their timers ({@link ServerMetrics#recordLeases}) and, with an fd
 * channel, the sweep of processes that were sent descriptors ({@link DescriptorPins}), and, on a
 * backend with completion events, every 2 ms the events of released blocks (cheap while none
 * is pending).
 *
 * <p>A periodic task that throws is logged and runs again at its next tick, whatever it threw:
 * a {@code ScheduledExecutorService} silently cancels a task that throws, and a daemon whose
 * reaper died would keep every dead client's memory. The exception is an {@link
 * OutOfMemoryError}: the daemon then exits at once with status 3, one line
 * saying why, so that its supervisor restarts it, rather than serving on with timers that
 * can no longer be trusted (the JVM flag {@code -XX:+ExitOnOutOfMemoryError} does the same for
 * every other thread). Thread-safe.
 */
final class Housekeeping implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(Housekeeping.class);
  /** The exit status on OutOfMemoryError, as {@code -XX:+ExitOnOutOfMemoryError} uses. */
  static final int OUT_OF_MEMORY_EXIT = 3;
  /** A task that keeps failing is logged with its stack trace once, then once a minute. */
  private static final long REPEAT_LOG_NANOS = TimeUnit.MINUTES.toNanos(1);

  private final ScheduledThreadPoolExecutor scheduler =
      new ScheduledThreadPoolExecutor(1, Listeners.daemonThreads("gpumemd-housekeeping"));

  /**
   * @param gate every round passes it: while a successor takes the state over, nothing here
   *     changes the books (a round the gate refuses is skipped)
   */
  Housekeeping(SessionRegistry registry, DevicePools pools, StreamWatchdog streams, boolean pollEvents,
      HandOverGate gate, DescriptorPins pins, ServerMetrics metrics) {
    scheduler.setRemoveOnCancelPolicy(true);
    // Off the lease path (see LeaseLatencies); it changes no books, so it passes no gate.
    every(100, new Task("Recording lease latencies", metrics::recordLeases));
    every(100, new Task("Session housekeeping", gated(gate, registry::reap)));
    if (pins != null) {
      every(100, new Task("The descriptor holders' sweep", gated(gate, pins::sweep)));
    }
    every(100, new Task("The stream watchdog", gated(gate, streams::closeStalled)));
    if (pollEvents) {
      for (DevicePool pool : pools.all()) {
        every(2, new Task("Completion event polling on device " + pool.device().ordinal(),
            gated(gate, pool::pollEvents)));
      }
    }
  }

  private static Runnable gated(HandOverGate gate, Runnable body) {
    return () -> {
      if (!gate.enter()) {
        return;
      }
      try {
        body.run();
      } finally {
        gate.exit();
      }
    };
  }

  private void every(long millis, Task task) {
    scheduler.scheduleWithFixedDelay(task, millis, millis, TimeUnit.MILLISECONDS);
  }

  /** One periodic task that survives its own failures; run by the one housekeeping thread. */
  static final class Task implements Runnable {
    private final String name;
    private final Runnable body;
    private long failures;
    private long lastLoggedNanos;

    Task(String name, Runnable body) {
      this.name = name;
      this.body = body;
    }

    @Override
    public void run() {
      try {
        body.run();
      } catch (OutOfMemoryError e) {
        outOfMemory(name, e);
      } catch (Throwable t) {
        failed(t);
      }
    }

    private void failed(Throwable t) {
      failures++;
      long now = System.nanoTime();
      if (failures == 1) {
        log.error("{} failed; it runs again at its next tick", name, t);
        lastLoggedNanos = now;
      } else if (now - lastLoggedNanos >= REPEAT_LOG_NANOS) {
        log.error("{} failed again ({} failures so far; the last: {})", name, failures, t.toString());
        lastLoggedNanos = now;
      }
    }

    long failures() {
      return failures;
    }
  }

  /**
   * Exits the daemon at once: a JVM out of memory cannot be trusted to drain. Halts rather
   * than exits, because shutdown hooks would try to drain and allocate.
   */
  static void outOfMemory(String where, OutOfMemoryError e) {
    try {
      log.error("{}: {}: gpumemd exits (status {}) so that its supervisor restarts it", where, e,
          OUT_OF_MEMORY_EXIT);
    } finally {
      Runtime.getRuntime().halt(OUT_OF_MEMORY_EXIT);
    }
  }

  @Override
  public void close() {
    scheduler.shutdownNow();
  }
}
