package io.gpumemd.client;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * How a {@link GpuMemClient} closes (the order and the bounds are documented on {@link
 * GpuMemClient#close()}): waits for the stream-ordered releases and the GPU work on the session's
 * memory, then ends the session and closes the fd channel and the connection; or, when that work
 * outlives the bound or its synchronize fails, keeps the session (a {@code gpumemd-client-linger}
 * thread closes it once the work is done).
 *
 * <p>Thread-safe: one caller closes, concurrent and later callers wait until it has finished.
 */
final class ClientClosing {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  private final SessionKeeper sessions;
  private final PendingReleases pendingReleases;
  private final FdChannelClient fdChannel;
  private final Channels.Connection connection;
  private final long closeWaitMillis;
  private final AtomicBoolean started = new AtomicBoolean();
  private final CountDownLatch closed = new CountDownLatch(1);

  ClientClosing(SessionKeeper sessions, PendingReleases pendingReleases, FdChannelClient fdChannel,
      Channels.Connection connection, long closeWaitMillis) {
    this.sessions = sessions;
    this.pendingReleases = pendingReleases;
    this.fdChannel = fdChannel;
    this.connection = connection;
    this.closeWaitMillis = closeWaitMillis;
  }

  /** Closes once; every call returns with the client closed (or its session kept, see above). */
  void close() {
    if (!started.compareAndSet(false, true)) {
      awaitClosed();
      return;
    }
    boolean kept = false;
    try {
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(closeWaitMillis);
      pendingReleases.close(closeWaitMillis);
      Session s = sessions.current();
      if (!s.isLost()) {
        QueuedGpuWork work = QueuedGpuWork.synchronize(s.mappings.cudaDevices());
        long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
        QueuedGpuWork.Outcome outcome = work.await(Math.max(left, GpuMemClient.MIN_SYNC_WAIT_MS));
        if (outcome != QueuedGpuWork.Outcome.DONE) {
          kept = true;
          keepUntilIdle(s, work, outcome);
          return;
        }
      }
      sessions.close();
    } finally {
      if (!kept) {
        closeTransports();
      }
      closed.countDown();
    }
  }

  /**
   * The GPU work on the session's memory outlived the close's bound, or its synchronize failed:
   * the session stays open, its blocks leased, until the work is done.
   */
  private void keepUntilIdle(Session s, QueuedGpuWork work, QueuedGpuWork.Outcome outcome) {
    sessions.refuseCalls();
    if (outcome == QueuedGpuWork.Outcome.FAILED) {
      log.warn("gpumemd client closing: synchronizing CUDA device(s) {} failed ({}); the GPU work on session {}'s "
          + "blocks may not have ended, so they are not handed back: the session is kept until this process exits",
          work.devices(), work.failure(), s.id);
      return;
    }
    log.warn("gpumemd client closing: GPU work on CUDA device(s) {} still running after {} ms; session {} and its "
        + "blocks are kept until it completes (or this process exits), then closed", work.devices(),
        closeWaitMillis, s.id);
    Thread linger = new Thread(() -> {
      if (work.awaitEnd() == QueuedGpuWork.Outcome.FAILED) {
        log.warn("gpumemd: synchronizing CUDA device(s) {} failed ({}); session {} is kept until this process exits",
            work.devices(), work.failure(), s.id);
        return;
      }
      try {
        sessions.close();
        log.info("gpumemd: the GPU work on session {}'s blocks completed; the session is closed", s.id);
      } finally {
        closeTransports();
      }
    }, "gpumemd-client-linger");
    linger.setDaemon(true);
    linger.start();
  }

  private void closeTransports() {
    fdChannel.close();
    connection.close();
  }

  private void awaitClosed() {
    try {
      closed.await();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
