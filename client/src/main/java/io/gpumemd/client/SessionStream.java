package io.gpumemd.client;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.grpc.stub.StreamObserver;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The client's half of one session's KeepAlive stream: the request side it sends on, whether
 * the daemon confirmed it (ATTACHED), and the latch of its end. A broken stream is reopened on
 * the same object ({@link SessionKeeper} decides when); once the session is lost or the client
 * closing, none opens any more.
 *
 * <p>Resending what a broken stream lost: every message sent for the session is numbered (1, 2,
 * ..., over all its streams, the attaching message too), and those not yet known to be applied
 * are kept (at most {@value #LOGGED}; the oldest dropped beyond that). A reply to a lease, or a
 * refused release, tells that its message and all before it were applied. The daemon's
 * StreamAttached says how many it applied before the new stream; the logged messages after that
 * count are sent again, as new messages, before anything composed since: each message is
 * applied exactly once, in the order composed. A lease whose message was applied but whose reply
 * was lost with the connection (possible only when the connection breaks, not when the daemon
 * moves: it sends every reply first) is asked for again; the daemon then holds the first grant,
 * unknown to the client, until the session ends ({@link #repliesLost}). Messages composed while
 * no stream is confirmed, or after the daemon said it is moving, wait for the next stream.
 *
 * <p>Thread-safety: all state is guarded by this object's own lock, the first of the session's
 * locks (then the client cache's, then the notices'). Messages are sent under it, so that
 * whatever is composed under it goes out in that order.
 */
final class SessionStream {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);
  /** Sent messages kept until known to be applied. */
  static final int LOGGED = 8192;

  /** A sent message not yet known to be applied. */
  private record Sent(long number, KeepAliveRequest message) {}

  /** A lease request not yet answered, and the number of the message that carried it (0: not sent yet). */
  private record Unanswered(StreamLease lease, long number) {}

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
  /** Messages sent for the session over all its streams: the number of the last one. */
  private long numbered;
  private final ArrayDeque<Sent> unconfirmed = new ArrayDeque<>();
  /** Composed while no stream was confirmed: sent after the next attach's resend. */
  private final List<KeepAliveRequest> held = new ArrayList<>();
  private final Map<Long, Unanswered> unanswered = new LinkedHashMap<>();
  /** The daemon said it is moving: nothing more is sent on this stream (it would not be applied). */
  private boolean moving;
  /** It said so with its MovingNotice, sent once its successor serves, not by refusing a message. */
  private boolean noticed;
  private long resent;
  private long repliesLost;

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
      moving = false;
      noticed = false;
      requests = call.apply(events);
      numbered++; // the daemon counts it too (renumbered at the attach); never sent again: it only names the session
      requests.onNext(hello);
    }
  }

  /**
   * The daemon confirmed the stream, having applied {@code applied} messages of the session
   * before it: the logged messages after those are sent again, then those held meanwhile.
   * Leases waiting for the stream ({@link #awaitAttached}) go on.
   */
  void attached(long applied) {
    synchronized (lock) {
      attached = true;
      broken = false;
      lock.notifyAll();
      if (requests == null || lost.getAsBoolean()) {
        return;
      }
      while (!unconfirmed.isEmpty() && unconfirmed.peekFirst().number() <= applied) {
        unconfirmed.pollFirst();
      }
      List<KeepAliveRequest> again = new ArrayList<>(unconfirmed.size() + held.size());
      Set<Long> leasesAgain = new HashSet<>();
      for (Sent sent : unconfirmed) {
        again.add(sent.message());
        for (StreamLease lease : sent.message().getLeasesList()) {
          leasesAgain.add(lease.getRequestId());
        }
      }
      resent += unconfirmed.size();
      unconfirmed.clear();
      // Leases sent whose message was applied (reply lost) or dropped from the log: asked for again.
      int lostReplies = 0;
      for (Map.Entry<Long, Unanswered> e : unanswered.entrySet()) {
        long number = e.getValue().number();
        if (number != 0 && !leasesAgain.contains(e.getKey())) {
          again.add(KeepAliveRequest.newBuilder().addLeases(e.getValue().lease()).build());
          if (number <= applied) {
            lostReplies++;
          }
        }
      }
      if (lostReplies > 0) {
        repliesLost += lostReplies;
        log.warn("gpumemd: the replies to {} lease request(s) were lost with the broken KeepAlive stream; asked "
            + "again (the daemon holds the first grants until the session ends)", lostReplies);
      }
      if (!again.isEmpty()) {
        log.debug("gpumemd: the daemon applied {} messages of the session; sending {} again", applied, again.size());
      }
      again.addAll(held);
      held.clear();
      // The daemon's count is the truth: messages that never reached it (lost in the connection,
      // or the hello of a stream that failed before it got through) took numbers it did not
      // count. This stream's hello was its message applied + 1; what follows is numbered after it.
      numbered = applied + 1;
      for (KeepAliveRequest message : again) {
        transmit(message);
      }
    }
  }

  /**
   * The daemon is moving to its successor: what is composed from now on waits for the next stream.
   *
   * @param notice it said so with its MovingNotice (its successor serves now), not by refusing a message
   */
  void moving(boolean notice) {
    synchronized (lock) {
      moving = true;
      noticed |= notice;
    }
  }

  /** Whether the daemon sent its MovingNotice on the stream that ended last; cleared by {@link #open}. */
  boolean wasNoticed() {
    synchronized (lock) {
      return noticed;
    }
  }

  /** Whether the daemon said, on the stream that ended last, that it is moving; cleared by {@link #open}. */
  boolean wasMoving() {
    synchronized (lock) {
      return moving;
    }
  }

  /** A lease was answered: its message and all before it were applied. */
  void leaseAnswered(long requestId) {
    synchronized (lock) {
      Unanswered u = unanswered.remove(requestId);
      if (u != null && u.number() != 0) {
        while (!unconfirmed.isEmpty() && unconfirmed.peekFirst().number() <= u.number()) {
          unconfirmed.pollFirst();
        }
      }
    }
  }

  /** A release or cache notice about {@code leaseId} was refused: the first message naming it was applied. */
  void noticeRefused(String leaseId) {
    synchronized (lock) {
      long upTo = 0;
      for (Sent sent : unconfirmed) {
        if (names(sent.message(), leaseId)) {
          upTo = sent.number();
          break;
        }
      }
      while (!unconfirmed.isEmpty() && unconfirmed.peekFirst().number() <= upTo) {
        unconfirmed.pollFirst();
      }
    }
  }

  private static boolean names(KeepAliveRequest m, String leaseId) {
    for (StreamRelease r : m.getReleasesList()) {
      if (r.getLeaseId().equals(leaseId)) {
        return true;
      }
    }
    for (CacheNotice n : m.getCacheNoticesList()) {
      if (n.getLeaseId().equals(leaseId)) {
        return true;
      }
    }
    return false;
  }

  /** Messages sent again on a new stream since the session opened (for tests and logs). */
  long resent() {
    synchronized (lock) {
      return resent;
    }
  }

  /** Leases asked for again because their reply was lost with a broken stream. */
  long repliesLost() {
    synchronized (lock) {
      return repliesLost;
    }
  }

  /** Sends a message, numbered and logged until known applied; under the lock, a stream confirmed. */
  private void transmit(KeepAliveRequest message) {
    long number = ++numbered;
    requests.onNext(message);
    unconfirmed.addLast(new Sent(number, message));
    for (StreamLease lease : message.getLeasesList()) {
      unanswered.put(lease.getRequestId(), new Unanswered(lease, number));
    }
    if (unconfirmed.size() > LOGGED) {
      Sent dropped = unconfirmed.pollFirst();
      log.debug("gpumemd: dropping sent KeepAlive message {} from the resend log (more than {} unconfirmed)",
          dropped.number(), LOGGED);
    }
  }

  /** Whether messages composed now go out: a confirmed stream the daemon is not leaving. */
  private boolean sending() {
    return requests != null && attached && !moving;
  }

  /** Whether messages composed now wait for the next stream: the session is being reattached. */
  private boolean holding() {
    return !closing && (broken || (requests != null && (!attached || moving)));
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
      if (lost.getAsBoolean()) {
        return false;
      }
      if (sending()) {
        for (KeepAliveRequest message : compose.get()) {
          transmit(message);
        }
        return true;
      }
      if (!holding()) {
        return false;
      }
      for (KeepAliveRequest message : compose.get()) {
        held.add(message);
        for (StreamLease lease : message.getLeasesList()) {
          unanswered.put(lease.getRequestId(), new Unanswered(lease, 0));
        }
      }
      return true;
    }
  }

  /**
   * Sends one message if a stream is confirmed (an unmap acknowledgement; one composed while
   * none is, is dropped: the daemon asks again for the unmaps it was not told of).
   */
  void sendIfOpen(KeepAliveRequest message) {
    synchronized (lock) {
      if (sending() && !lost.getAsBoolean()) {
        transmit(message);
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
