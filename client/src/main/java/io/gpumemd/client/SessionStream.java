package io.gpumemd.client;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.grpc.stub.StreamObserver;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * The client's half of one session's KeepAlive stream: the request side it sends on, whether
 * the daemon confirmed it (ATTACHED), and the latch of its end. A broken stream is reopened on
 * the same object ({@link SessionKeeper} decides when); once the session is lost or the client
 * closing, none opens any more.
 *
 * <p>Thread-safety: all state is guarded by this object's own lock, the first of the session's
 * locks (then the client cache's, then the notices'). Messages are sent under it, so that
 * whatever is composed under it goes out in that order.
 */
final class SessionStream {
  private final Object lock = new Object();
  private final BooleanSupplier lost;
  private StreamObserver<KeepAliveRequest> requests; // null while no stream is open
  /** The daemon confirmed the current stream (ATTACHED) and it has not ended. */
  private boolean attached;
  /** When the stream broke after its last confirmation; meaningful while {@code broken}. */
  private long brokenSinceNanos;
  private boolean broken;
  private CountDownLatch done; // the current stream's end
  private boolean closing;

  /** @param lost whether the session is lost: then nothing is sent or opened */
  SessionStream(BooleanSupplier lost) {
    this.lost = lost;
  }

  /**
   * Opens a stream, {@code call} given the observer of the daemon's events, and sends
   * {@code hello} on it; nothing when the session is lost or the client closing.
   */
  void open(Function<StreamObserver<SessionEvent>, StreamObserver<KeepAliveRequest>> call,
      StreamObserver<SessionEvent> events, CountDownLatch done, KeepAliveRequest hello) {
    synchronized (lock) {
      if (closing || lost.getAsBoolean()) {
        return;
      }
      this.done = done;
      requests = call.apply(events);
      requests.onNext(hello);
    }
  }

  /** The daemon confirmed the stream: leases waiting for it ({@link #awaitAttached}) go on. */
  void attached() {
    synchronized (lock) {
      attached = true;
      broken = false;
      lock.notifyAll();
    }
  }

  /**
   * The stream ended or broke; the session may still open another.
   *
   * @return since when the session has had no confirmed stream: now, unless it already broke
   *     and no stream was confirmed since (the daemon's grace period runs from that moment)
   */
  long broken(long nowNanos) {
    synchronized (lock) {
      requests = null;
      attached = false;
      if (!broken) {
        broken = true;
        brokenSinceNanos = nowNanos;
      }
      return brokenSinceNanos;
    }
  }

  /**
   * Waits until the daemon confirms a stream, the session is lost or the client closing, or
   * {@code deadlineNanos} (of {@code ticker}) passes.
   */
  void awaitAttached(long deadlineNanos, Ticker ticker) throws InterruptedException {
    synchronized (lock) {
      while (!attached && !lost.getAsBoolean() && !closing) {
        long left = deadlineNanos - ticker.nanos();
        if (left <= 0) {
          return;
        }
        TimeUnit.NANOSECONDS.timedWait(lock, left);
      }
    }
  }

  /**
   * Sends the messages {@code compose} builds, in order, composed under this stream's lock.
   *
   * @return false (and nothing composed) when no stream is open or the session is lost
   */
  boolean send(Supplier<List<KeepAliveRequest>> compose) {
    synchronized (lock) {
      if (requests == null || lost.getAsBoolean()) {
        return false;
      }
      for (KeepAliveRequest message : compose.get()) {
        requests.onNext(message);
      }
      return true;
    }
  }

  /** Sends one message if a stream is open (an unmap acknowledgement). */
  void sendIfOpen(KeepAliveRequest message) {
    synchronized (lock) {
      if (requests != null && !lost.getAsBoolean()) {
        requests.onNext(message);
      }
    }
  }

  /** The client is closing: no stream opens any more, and leases waiting for one give up. */
  void closing() {
    synchronized (lock) {
      closing = true;
      lock.notifyAll();
    }
  }

  /**
   * Sends what {@code last} composes and ends the stream, then waits up to {@code waitMillis}
   * for the daemon to end its side: it has then applied all of it.
   */
  void finish(Supplier<List<KeepAliveRequest>> last, long waitMillis) {
    CountDownLatch ended;
    synchronized (lock) {
      if (requests == null) {
        return;
      }
      send(last);
      requests.onCompleted();
      requests = null;
      ended = done;
    }
    try {
      ended.await(waitMillis, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Ends the stream if one is open, and wakes leases waiting for it (the session is lost, or the client closed). */
  void end() {
    synchronized (lock) {
      lock.notifyAll();
      if (requests != null) {
        try {
          requests.onCompleted();
        } catch (RuntimeException ignored) {
          // the stream is broken anyway
        }
        requests = null;
      }
    }
  }
}
