package io.gpumemd.client;

import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SleepAsked;
import io.grpc.Status;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An admin's sleep and wake of this client's session (SessionEvent.sleep_asked): the consent
 * (whether the application registered a {@link SleepHandler}, told to the daemon on every
 * stream's attach and when it changes) and the answer to each ask, run off the gRPC thread:
 * sleep is the handler's pause, then this client's own sleep naming the admin's request ({@link
 * SleepCalls}), and its resume when the sleep failed; wake is the client's own wake, then the
 * handler's resume. Whatever goes wrong is sent to the daemon as the refusal of the request, so
 * the admin always gets an answer.
 *
 * <p>Thread-safe: the handler is volatile; asks run one at a time on one daemon thread, made at
 * the first ask.
 */
final class AskedSleeps {
  private static final Logger log = LoggerFactory.getLogger(ClientLog.NAME);

  private final SessionKeeper sessions;
  private final SleepCalls sleeps;
  private volatile SleepHandler handler;
  private ExecutorService runner; // guarded by this

  AskedSleeps(SessionKeeper sessions, SleepCalls sleeps) {
    this.sessions = sessions;
    this.sleeps = sleeps;
  }

  /** The application's handler, or null to withdraw it; the daemon is told at once. */
  void register(SleepHandler handler) {
    this.handler = handler;
    tell(sessions.current());
  }

  /**
   * A stream of {@code s} attached: the daemon hears of a handler (the consent is the session's,
   * told again on every stream, so that a successor daemon hears it too). Without one, nothing is
   * sent: the daemon assumes none.
   */
  void attached(Session s) {
    if (handler != null) {
      tell(s);
    }
  }

  private void tell(Session s) {
    s.stream.sendIfOpen(KeepAliveRequest.newBuilder().setSleepHandler(handler != null).build());
  }

  /** The daemon asks (on the gRPC thread): answered on this object's thread. */
  void asked(Session s, SleepAsked ask) {
    try {
      runner().execute(() -> answer(s, ask));
    } catch (RejectedExecutionException e) {
      log.warn("gpumemd: an admin's {} of session {} arrived while the client closes: not answered",
          ask.getWake() ? "wake" : "sleep", s.id);
    }
  }

  private synchronized ExecutorService runner() {
    if (runner == null) {
      runner = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "gpumemd-client-sleep");
        t.setDaemon(true);
        return t;
      });
    }
    return runner;
  }

  private void answer(Session s, SleepAsked ask) {
    SleepHandler h = handler;
    String verb = ask.getWake() ? "wake" : "sleep";
    log.info("gpumemd: an admin asks to {} session {} (request {})", verb, s.id, ask.getRequestId());
    if (h == null) {
      refuse(s, ask, Status.Code.FAILED_PRECONDITION, "this process withdrew its sleep handler");
      return;
    }
    if (ask.getWake()) {
      wake(s, ask, h);
      return;
    }
    List<String> tags = List.copyOf(ask.getTagsList());
    try {
      h.pause(ask.getLevel(), tags);
    } catch (Exception | LinkageError e) {
      refuse(s, ask, Status.Code.FAILED_PRECONDITION, "its sleep handler refused to pause: " + e);
      return;
    }
    try {
      sleeps.sleep(ask.getLevel(), tags, ask.getRequestId());
    } catch (RuntimeException | LinkageError e) {
      // A refusal at the daemon reached the admin already (then this one is refused in turn);
      // a failure here, before the call, did not.
      refuse(s, ask, e instanceof GpuMemException g ? g.code() : Status.Code.INTERNAL, "its sleep failed: " + e);
      log.warn("gpumemd: an admin's sleep of session {} failed, resuming: {}", s.id, e.toString());
      resume(h);
    }
  }

  private void wake(Session s, SleepAsked ask, SleepHandler h) {
    try {
      sleeps.wake(ask.getRequestId());
    } catch (RuntimeException | LinkageError e) {
      // As for a sleep: a failure before the call reaches the admin only by this refusal.
      refuse(s, ask, e instanceof GpuMemException g ? g.code() : Status.Code.INTERNAL, "its wake failed: " + e);
      log.warn("gpumemd: an admin's wake of session {} failed; the session stays asleep: {}", s.id, e.toString());
      return;
    }
    resume(h);
  }

  private void refuse(Session s, SleepAsked ask, Status.Code code, String why) {
    log.warn("gpumemd: refusing an admin's {} of session {}: {}", ask.getWake() ? "wake" : "sleep", s.id, why);
    try {
      sleeps.refuse(s, ask.getRequestId(), ask.getWake(), code, why);
    } catch (RuntimeException e) {
      log.debug("gpumemd: refusal not taken (the admin had its answer, or its call timed out): {}", e.toString());
    }
  }

  private static void resume(SleepHandler h) {
    try {
      h.resume();
    } catch (RuntimeException | LinkageError e) {
      log.warn("gpumemd: the sleep handler's resume failed", e);
    }
  }

  /** The client closes: no ask is answered any more. */
  synchronized void close() {
    if (runner != null) {
      runner.shutdownNow();
    }
  }
}
