package io.gpumemd.server;

import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.takeover.HandOver;
import io.grpc.protobuf.services.HealthStatusManager;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The daemon's one way down, whatever the reason ({@link Reason}): the same steps in the same
 * order, each reason entering those that concern it.
 *
 * <ol>
 *   <li>Probes and health say so (/readyz 503, NOT_SERVING), and the sessions go: drained and
 *       ended ({@link Reason#SHUTDOWN}), or told they moved once the listeners take no new
 *       connection ({@link Reason#HANDED_OVER}: told first, since their leases wait until they
 *       reach the successor, and then left {@value #LINGER_AFTER_HAND_OVER_MILLIS} ms to do so
 *       before the rest of the stop competes with them for the cores); a failed start has none.
 *   <li>Housekeeping, the listeners and the backend threads stop.
 *   <li>The memory is freed, or kept where it is another daemon's ({@link Reason#keepsMemory}).
 *   <li>The backend and the take-over socket close.
 *   <li>The daemon is stopped ({@link #awaitTermination} returns), or after a hand-over with
 *       {@code --after-hand-over wait} waits for SIGTERM first.
 * </ol>
 *
 * <p>Owns the daemon's lifecycle (serving, stopping, stopped, handed over and waiting), not the
 * parts it stops. Thread-safe: the first reason to stop wins ({@link #begin}), later callers wait
 * for it; logs under {@link GpumemdServer}'s name, as the daemon always has.
 */
final class DaemonStop {
  private static final Logger log = LoggerFactory.getLogger(GpumemdServer.class);
  /**
   * How long a daemon that handed over waits, its clients told, before the rest of its stop.
   * Its clients reattach to the successor within tens of milliseconds of being told, and the
   * rest of the stop, run meanwhile, took the cores from them. Measured with {@code
   * TakeOverPauseMain} (64 live leases, two rounds of 10 take-overs each way, alternated, on two
   * cores): without it, the longest lease wait p50 58 and 58 ms (max 96 and 101); with it, 44
   * and 52 ms (max 88 and 149); from the notices to the end of the longest wait, at the medians,
   * 27 and 31 ms without, 19 and 22 with. The price: the old daemon exits 100 ms later.
   */
  static final long LINGER_AFTER_HAND_OVER_MILLIS = 100;

  /** Why the daemon stops: where it enters the steps, and whether the memory stays. */
  enum Reason {
    /** The start failed: nothing was served, the memory is this daemon's own. */
    FAILED_START(false),
    /** A take-over failed before its point of no return: the memory is the running daemon's. */
    FAILED_TAKE_OVER(true),
    /** A successor took the state: the memory is its own now. */
    HANDED_OVER(true),
    /** SIGTERM or an admin's shutdown: drain, end every session, free everything. */
    SHUTDOWN(false);

    final boolean keepsMemory;

    Reason(boolean keepsMemory) {
      this.keepsMemory = keepsMemory;
    }
  }

  /** Where the daemon is in its life. */
  private enum Lifecycle {
    SERVING, STOPPING, STOPPED,
    /** Handed over, and waiting for SIGTERM to exit ({@code --after-hand-over wait}). */
    HANDED_OVER
  }

  /** What the steps stop, in the daemon that owns them. */
  record Parts(ServerConfig config, Readiness readiness, HealthStatusManager health, Listeners listeners,
      SessionRegistry registry, ThreadPoolExecutor blockingExecutor, DevicePools pools, MemoryBackend backend) {}

  private final Parts parts;
  private final AtomicReference<Lifecycle> lifecycle = new AtomicReference<>(Lifecycle.SERVING);
  private final Object terminated = new Object();
  private volatile Housekeeping housekeeping;
  private volatile HandOver handOver;
  private volatile boolean force;

  DaemonStop(Parts parts) {
    this.parts = parts;
  }

  /** Housekeeping started: stopped in step 3. */
  void housekeeping(Housekeeping housekeeping) {
    this.housekeeping = housekeeping;
  }

  /** The take-over socket was bound: closed in step 5. */
  void handOver(HandOver handOver) {
    this.handOver = handOver;
  }

  /** Cuts a drain short (a second SIGTERM, or {@code shutdown(force)}). */
  void force() {
    force = true;
  }

  /** Takes the daemon from serving to stopping; false when another reason got there first. */
  boolean begin() {
    return lifecycle.compareAndSet(Lifecycle.SERVING, Lifecycle.STOPPING);
  }

  /**
   * A shutdown after a hand-over whose daemon waits for SIGTERM: it is stopped now.
   *
   * @return false when the daemon was not waiting after a hand-over
   */
  boolean exitAfterHandOver() {
    if (!lifecycle.compareAndSet(Lifecycle.HANDED_OVER, Lifecycle.STOPPED)) {
      return false;
    }
    log.info("Signalled after the hand-over: exiting");
    synchronized (terminated) {
      terminated.notifyAll();
    }
    return true;
  }

  /** Runs the steps for {@code why}; the caller won {@link #begin} (a failed start has nothing to win). */
  void run(Reason why, int successorPid) {
    Parts p = parts;
    try {
      if (why == Reason.HANDED_OVER) {
        // New connections go to the successor (it owns the socket paths); this daemon's clients
        // learn it from their streams' MovingNotice and from the GOAWAY of their connections.
        // They are told first, since their leases wait until they reach the successor; the
        // notices before the GOAWAY, which took up to 14 ms on two busy cores (a Java client
        // moves its stream at the notice, over a connection made before the pause or a new one;
        // another sees the GOAWAY before it opens its next stream, or is refused as moving and
        // tries again). The fd channel closes after (its event loop takes milliseconds to stop),
        // by when their connections have GOAWAY, so they call again on new ones.
        p.registry().moved();
        p.listeners().sendAway();
        HandOver h = handOver;
        if (h != null) {
          // Requests that waited for the hand-over: their clients call again now, there.
          h.moved();
        }
        p.readiness().handedOver(successorPid);
        p.health().enterTerminalState();
        p.listeners().stopAccepting();
        // The clients reattach to the successor now; the rest of this stop (threads, mappings,
        // and the exit that frees this JVM's heap) would take the cores from them and from the
        // successor, which serves them. Nothing here serves or changes books any more.
        sleep(LINGER_AFTER_HAND_OVER_MILLIS);
      } else {
        if (why == Reason.SHUTDOWN) {
          p.readiness().draining();
        }
        p.health().enterTerminalState();
        if (why == Reason.SHUTDOWN) {
          drain();
        }
      }
      stopThreads(why);
      if (why.keepsMemory) {
        p.pools().relinquish();
      } else {
        p.pools().close();
      }
      p.backend().close();
      HandOver h = handOver;
      if (h != null) {
        h.close();
      }
    } finally {
      stopped(why, successorPid);
    }
  }

  /** Step 2 of a shutdown: new leases refused, clients told, leases given back until the drain timeout, sessions ended. */
  private void drain() {
    SessionRegistry registry = parts.registry();
    long drainMillis = force ? 0 : parts.config().drainTimeoutMillis();
    log.info("Shutting down: draining {} lease(s) for up to {} ms", registry.liveLeases(), drainMillis);
    registry.beginDrain(drainMillis);
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(drainMillis);
    while (!force && registry.liveLeases() > 0 && System.nanoTime() < deadline) {
      sleep(20);
    }
    int left = registry.liveLeases();
    if (left > 0) {
      log.warn("Drain ended with {} lease(s) still held; freeing them", left);
    }
    registry.endAll("server shutdown");
  }

  /** Step 3: housekeeping, listeners, backend threads (a shutdown lets running backend calls end). */
  private void stopThreads(Reason why) {
    Housekeeping h = housekeeping;
    if (h != null) {
      h.close();
    }
    parts.listeners().close();
    ThreadPoolExecutor executor = parts.blockingExecutor();
    if (why != Reason.SHUTDOWN) {
      executor.shutdownNow();
      return;
    }
    executor.shutdown();
    try {
      executor.awaitTermination(2, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Step 6: the last line, and the waiters woken. */
  private void stopped(Reason why, int successorPid) {
    Lifecycle end = Lifecycle.STOPPED;
    if (why == Reason.SHUTDOWN) {
      log.info("gpumemd stopped; all device memory freed");
    } else if (why == Reason.HANDED_OVER) {
      boolean exit = parts.config().takeOver().exitAfterHandOver();
      log.info("gpumemd handed over to pid {}: stopped; no memory freed (it is the successor's){}", successorPid,
          exit ? "" : "; waiting for SIGTERM (--after-hand-over wait)");
      end = exit ? Lifecycle.STOPPED : Lifecycle.HANDED_OVER;
    }
    synchronized (terminated) {
      lifecycle.set(end);
      terminated.notifyAll();
    }
  }

  /** Waits until the daemon has stopped. */
  void awaitTermination() {
    synchronized (terminated) {
      while (lifecycle.get() != Lifecycle.STOPPED) {
        try {
          terminated.wait();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return;
        }
      }
    }
  }

  private static void sleep(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
