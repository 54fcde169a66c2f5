package io.gpumemd.server;

import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.SessionRegistry;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The daemon's timers, on one thread: every 100 ms the session reaper (grace periods, TTLs,
 * leak warnings) and, on a backend with completion events, every 2 ms the events of released
 * blocks (cheap while none is pending). A failure is logged and the timer keeps running.
 * Thread-safe.
 */
final class Housekeeping implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(Housekeeping.class);

  private final ScheduledThreadPoolExecutor scheduler =
      new ScheduledThreadPoolExecutor(1, Listeners.daemonThreads("gpumemd-housekeeping"));

  Housekeeping(SessionRegistry registry, DevicePools pools, boolean pollEvents) {
    scheduler.setRemoveOnCancelPolicy(true);
    scheduler.scheduleWithFixedDelay(() -> {
      try {
        registry.reap();
      } catch (RuntimeException e) {
        log.error("Session housekeeping failed", e);
      }
    }, 100, 100, TimeUnit.MILLISECONDS);
    if (!pollEvents) {
      return;
    }
    scheduler.scheduleWithFixedDelay(() -> {
      for (DevicePool pool : pools.all()) {
        try {
          pool.pollEvents();
        } catch (RuntimeException e) {
          log.error("Completion event polling failed on device {}", pool.device().ordinal(), e);
        }
      }
    }, 2, 2, TimeUnit.MILLISECONDS);
  }

  @Override
  public void close() {
    scheduler.shutdownNow();
  }
}
