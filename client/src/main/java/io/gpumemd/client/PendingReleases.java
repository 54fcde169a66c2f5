package io.gpumemd.client;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Stream-ordered releases ({@link CudaLeases#closeAfter}): a lease whose last GPU use is still
 * queued is released only once an event recorded after that use has completed. The event is
 * recorded in this process and polled here, by one client thread ({@code
 * gpumemd-client-releases}, started with the first such release): the caller never waits, and
 * the daemon is never sent an event handle (an IPC event opens only in the daemon's PID
 * namespace, and the daemon could not know when the client may destroy it).
 *
 * <p>The thread polls every pending completion, sleeping {@value #MIN_POLL_MICROS} µs after a
 * round that found something complete, doubling to {@value #MAX_POLL_MICROS} µs while nothing
 * does. A completed release is destroyed (the event), then given back as a plain close would
 * (client cache or daemon). A completion that fails to answer ({@code cuEventQuery} failing
 * other than NOT_READY: a sticky context error, an event that no longer exists) is not taken as
 * complete: what became of the work before it is unknown, and a block handed to another process
 * while a kernel may still write it is silent corruption. The lease is kept (never released
 * here), logged once, its completion destroyed; the session's end returns it, after the client's
 * close has synchronized the device ({@link GpuMemClient#close()}), as the Python client does.
 * A lease whose session is lost is dropped (its memory went with the session) and its
 * completion destroyed.
 *
 * <p>{@link #close(long)} (the client closing) waits up to its bound for what is pending, then
 * destroys the completions still pending (no event outlives the client) and leaves their leases
 * to the session's end, which the client lets happen only once the device's work has been
 * synchronized (destroying an event does not wait for its work); a release asked for after
 * close is refused ({@link #add} returns false) and the caller destroys its own completion.
 *
 * <p>Thread-safe: the queue is guarded by this object's monitor; completions are queried and
 * destroyed only on the polling thread, or by the caller whose {@link #add} was refused.
 */
final class PendingReleases {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);
  static final long MIN_POLL_MICROS = 50;
  static final long MAX_POLL_MICROS = 2000;

  /** What a release waits for: an event recorded after the lease's last use, in practice. */
  interface Completion {
    /**
     * True once the work before it has completed.
     *
     * @throws RuntimeException when it cannot tell (its lease is then kept: see the class comment)
     */
    boolean isComplete();

    /** Frees what the completion holds (the event); called exactly once. */
    void destroy();
  }

  private record Pending(Lease lease, Completion completion, Consumer<Lease> release) {}

  private final List<Pending> queue = new ArrayList<>();
  private Thread poller;
  private boolean closed;
  private long released;
  private long kept;

  /**
   * Queues a release that waits for {@code completion}; {@code release} gives the lease back
   * once it completed (on the polling thread).
   *
   * @return false when closed: nothing was queued, and the caller still owns the completion
   */
  synchronized boolean add(Lease lease, Completion completion, Consumer<Lease> release) {
    if (closed) {
      return false;
    }
    queue.add(new Pending(lease, completion, release));
    if (poller == null) {
      poller = new Thread(this::poll, "gpumemd-client-releases");
      poller.setDaemon(true);
      poller.start();
    }
    notifyAll();
    return true;
  }

  /** Releases waiting for their completion. */
  synchronized int pending() {
    return queue.size();
  }

  /** Releases sent (or dropped with a lost session) once their completion was seen. */
  synchronized long released() {
    return released;
  }

  /** Releases kept for the session's end because their completion could not be queried. */
  synchronized long kept() {
    return kept;
  }

  /**
   * Waits up to {@code boundMillis} for the pending releases, then destroys the completions of
   * those still pending and stops the thread; later {@link #add} calls are refused. Idempotent.
   *
   * @return releases still pending at the bound (their leases go back with the session's end)
   */
  int close(long boundMillis) {
    Thread thread;
    synchronized (this) {
      if (closed && poller == null) {
        return 0;
      }
      closed = true;
      thread = poller;
      notifyAll();
    }
    if (thread == null) {
      return 0;
    }
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(boundMillis);
    synchronized (this) {
      while (!queue.isEmpty() && System.nanoTime() < deadline) {
        waitNanos(Math.min(TimeUnit.MILLISECONDS.toNanos(10), deadline - System.nanoTime()));
      }
      poller = null; // the thread sees it and ends
      notifyAll();
    }
    join(thread);
    List<Pending> left;
    synchronized (this) {
      left = new ArrayList<>(queue);
      queue.clear();
    }
    for (Pending p : left) {
      destroy(p);
    }
    if (!left.isEmpty()) {
      log.warn("gpumemd client closing: {} stream-ordered release(s) still waiting for GPU work after {} ms; "
          + "their events are destroyed, and their blocks go back with the session only once the device's work "
          + "is synchronized", left.size(), boundMillis);
    }
    return left.size();
  }

  /** The polling thread: until closed and drained, or told to stop. */
  private void poll() {
    long sleepMicros = MIN_POLL_MICROS;
    while (true) {
      List<Pending> round;
      synchronized (this) {
        while (queue.isEmpty() && poller == Thread.currentThread() && !closed) {
          waitNanos(TimeUnit.SECONDS.toNanos(1));
        }
        if (poller != Thread.currentThread() || queue.isEmpty()) {
          return; // stopped by close, which destroys what is left
        }
        round = new ArrayList<>(queue);
      }
      boolean any = false;
      for (Pending p : round) {
        synchronized (this) {
          if (poller != Thread.currentThread()) {
            return; // stopped by close, which destroys what is left
          }
        }
        Settled settled = settle(p);
        if (settled != Settled.WAITING) {
          synchronized (this) {
            queue.remove(p);
            if (settled == Settled.RELEASED) {
              released++;
            } else {
              kept++;
            }
          }
          any = true;
        }
      }
      sleepMicros = any ? MIN_POLL_MICROS : Math.min(MAX_POLL_MICROS, sleepMicros * 2);
      // Parked, not a timed wait on the monitor: Object.wait rounds anything under a
      // millisecond up to one. Nothing needs waking it early: a new release is polled at most
      // MAX_POLL_MICROS later, and close sees it stopped as soon.
      LockSupport.parkNanos(TimeUnit.MICROSECONDS.toNanos(sleepMicros));
    }
  }

  /** What became of a pending release when it was polled. */
  private enum Settled {
    /** Its work is still running. */
    WAITING,
    /** Released (or dropped with its lost session). */
    RELEASED,
    /** Its completion could not be queried: the lease is kept for the session's end. */
    KEPT
  }

  /** One pending release polled once. */
  private static Settled settle(Pending p) {
    if (p.lease.isLost()) {
      destroy(p);
      return Settled.RELEASED;
    }
    boolean complete;
    try {
      complete = p.completion.isComplete();
    } catch (RuntimeException e) {
      log.warn("gpumemd lease {}: its release event cannot be queried ({}); the GPU work on it may not have ended, "
          + "so it is not released: the session's end returns it", p.lease.id(), e.getMessage());
      destroy(p);
      return Settled.KEPT;
    }
    if (!complete) {
      return Settled.WAITING;
    }
    destroy(p);
    try {
      p.release.accept(p.lease);
    } catch (RuntimeException e) {
      log.warn("gpumemd lease {}: release after its event failed: {}", p.lease.id(), e.getMessage());
    }
    return Settled.RELEASED;
  }

  private static void destroy(Pending p) {
    try {
      p.completion.destroy();
    } catch (RuntimeException e) {
      log.warn("gpumemd lease {}: destroying its release event failed: {}", p.lease.id(), e.getMessage());
    }
  }

  private void waitNanos(long nanos) {
    assert Thread.holdsLock(this);
    if (nanos <= 0) {
      return;
    }
    try {
      TimeUnit.NANOSECONDS.timedWait(this, nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private static void join(Thread thread) {
    try {
      thread.join(TimeUnit.SECONDS.toMillis(5));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
