package io.gpumemd.client;

import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.ReleaseFailed;
import io.gpumemd.proto.v1.SessionEvent;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What the daemon says on one KeepAlive stream of a session, applied to that session: the
 * attach, unmap requests, lease replies, refused notices, cache give-backs and allowance
 * changes, the shutdown notice. One per stream opened; how the stream ended goes to
 * {@code ended}, which decides between reattaching and losing the session.
 *
 * <p>Events arrive on a transport thread, one at a time.
 */
final class SessionEvents implements ClientResponseObserver<KeepAliveRequest, SessionEvent> {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  private final Session s;
  private final CountDownLatch done;
  private final Consumer<Long> onShutdownNotice;
  private final Consumer<Status> ended;
  /** An admin's sleep and wake asks; null before the client is built (no ask comes before the consent). */
  private final AskedSleeps asked;
  /** Told the socket a successor listens on before it takes the session over. */
  private final Consumer<String> successorAt;
  /** Told when the stream attached (after a move, the channel's primary reconnects then). */
  private final Runnable onAttached;

  /**
   * @param done counted down when the stream ends
   * @param onShutdownNotice told the drain timeout when the daemon announces its shutdown
   * @param ended told how the stream ended (OK when the daemon completed it)
   * @param asked answers an admin's sleep and wake, and says on each attach whether it may
   * @param successorAt told the socket name of a successor about to take the session over
   * @param onAttached told each time the stream attaches, after what was held is sent
   */
  SessionEvents(Session session, CountDownLatch done, Consumer<Long> onShutdownNotice, Consumer<Status> ended,
      AskedSleeps asked, Consumer<String> successorAt, Runnable onAttached) {
    this.successorAt = successorAt;
    this.onAttached = onAttached;
    this.s = session;
    this.done = done;
    this.onShutdownNotice = onShutdownNotice;
    this.ended = ended;
    this.asked = asked;
  }

  @Override
  public void beforeStart(ClientCallStreamObserver<KeepAliveRequest> requests) {}

  @Override
  public void onNext(SessionEvent event) {
    if (s.isLost()) {
      return; // nothing of a lost session's stream concerns the client any more
    }
    ClientCache cache = s.cache;
    switch (event.getEventCase()) {
      case ATTACHED -> {
        // Sends again what the daemon did not apply of the broken stream's messages, then what
        // was held meanwhile.
        s.stream.attached(event.getAttached().getAppliedMessages());
        s.firstAttach.countDown();
        s.notices.flush(); // what queued up while the stream was away
        if (asked != null) {
          asked.attached(s); // the consent belongs to the stream's session: told on every attach
        }
        onAttached.run();
      }
      case SLEEP_ASKED -> {
        if (asked != null) {
          asked.asked(s, event.getSleepAsked());
        }
      }
      case UNMAP -> s.mappings.unmapRequested(event.getUnmap().getSegmentId());
      case LEASE_REPLY -> {
        s.stream.leaseAnswered(event.getLeaseReply().getRequestId());
        s.leaseReplied(event.getLeaseReply());
      }
      case RELEASE_FAILED -> {
        s.stream.noticeRefused(event.getReleaseFailed().getLeaseId());
        refused(event.getReleaseFailed(), cache);
      }
      case MOVING -> {
        // The daemon hands the session to its successor and ends the stream next: reattach at once
        // (logged there, SessionKeeper).
        s.stream.moving(true);
      }
      case SUCCESSOR -> successorAt.accept(event.getSuccessor().getSocketName()); // its connect is asynchronous
      case RETURN_CACHE -> s.giveBack(cache == null ? List.of()
          : cache.giveBack(event.getReturnCache().getDevice(), event.getReturnCache().getBytes()));
      case CACHE_ALLOWANCE -> s.giveBack(cache == null ? List.of()
          : cache.setAllowance(event.getCacheAllowance().getBytes()));
      case SHUTDOWN -> {
        log.info("gpumemd is shutting down; drain timeout {} ms", event.getShutdown().getDrainTimeoutMs());
        // The daemon drains leases: cached ones go back now, closed ones from now on.
        if (cache != null) {
          s.giveBack(cache.setAllowance(0));
        }
        onShutdownNotice.accept(event.getShutdown().getDrainTimeoutMs());
      }
      default -> { }
    }
  }

  /**
   * The daemon refused a notice. A cache notice past its allowance (RESOURCE_EXHAUSTED) leaves
   * the lease in use at the daemon: the tier takes it out and releases it, so that both books
   * agree (unless it was handed out again since: then they already do).
   */
  private void refused(ReleaseFailed failed, ClientCache cache) {
    Status.Code code = Status.fromCodeValue(failed.getError().getCode()).getCode();
    Lease lease = code == Status.Code.RESOURCE_EXHAUSTED && cache != null ? cache.refused(failed.getLeaseId()) : null;
    if (lease != null) {
      s.giveBack(List.of(lease));
      log.warn("gpumemd refused to count lease {} as client-cached, released it instead: {} {}",
          failed.getLeaseId(), code, failed.getError().getMessage());
    } else {
      log.warn("gpumemd refused a notice about lease {}: {} {}", failed.getLeaseId(), code,
          failed.getError().getMessage());
    }
  }

  @Override
  public void onError(Throwable t) {
    done.countDown();
    Status status = Status.fromThrowable(t);
    if (MovingRetry.isMoving(status, Status.trailersFromThrowable(t))) {
      // A message the moving daemon did not apply: the stream reattaches soon, to its successor.
      s.stream.moving(false);
    }
    ended.accept(status);
  }

  @Override
  public void onCompleted() {
    done.countDown();
    ended.accept(Status.OK);
  }
}
