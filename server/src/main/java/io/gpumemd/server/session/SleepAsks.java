package io.gpumemd.server.session;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.books.Validation;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.error.TimedOutException;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An admin's sleep and wake of a session (Admin.SleepSession, WakeSession): the daemon cannot
 * sleep a session alone, since only its client can pause the application and vacate its own
 * mappings, so it asks the client ({@link SessionChannel#sleepAsked}) and the client answers
 * with its own Sleep or Wake naming the request ({@link #claim}), whose outcome completes the
 * admin's call.
 *
 * <p>Consent: only a session whose client said it has a sleep handler ({@link
 * Session#sleepHandler}) is asked; any other ask is refused at once and changes nothing. The
 * bound: a client whose Sleep or Wake has not arrived within the wait ({@code --unmap-wait-ms})
 * fails the admin's call with DEADLINE_EXCEEDED, and the request is forgotten, so a late answer
 * is refused and changes nothing: the admin's answer always says what happened. Once claimed,
 * the admin waits for the daemon's own work (the copies), which the daemon bounds itself.
 *
 * <p>Thread-safe: asks live in concurrent maps; who ends an ask (its claim or its timeout) is
 * decided by removing it from {@code byId}, once.
 */
public final class SleepAsks {
  private static final Logger log = LoggerFactory.getLogger(SleepAsks.class);

  private final SessionDirectory directory;
  private final AtomicLong ids = new AtomicLong();
  private final Map<Long, Ask> byId = new ConcurrentHashMap<>();
  /** One ask per session at a time: the session id to its ask. */
  private final Map<String, Ask> bySession = new ConcurrentHashMap<>();

  /**
   * One admin's request, awaiting its client's answer.
   *
   * @param answer completed with the sleep's {@link SessionSleep.Slept}, the wake's list of
   *     {@link SessionSleep.Woken}, or the failure the admin gets
   */
  public record Ask(long id, Session session, boolean wake, CompletableFuture<Object> answer) {
    /** The client's Sleep or Wake did this: the admin gets it. */
    public void answered(Object result) {
      answer.complete(result);
    }

    /** The client refused, or its Sleep or Wake was refused: the admin gets this failure. */
    public void failed(Throwable error) {
      answer.completeExceptionally(error);
    }

    String verb() {
      return wake ? "wake" : "sleep";
    }
  }

  SleepAsks(SessionDirectory directory) {
    this.directory = directory;
  }

  /**
   * Asks the client of a session to sleep or wake it; a refusal changes nothing.
   *
   * @param level 1 or 2 (0 means 1); unused for a wake
   * @param waitMillis how long the client has to answer ({@code --unmap-wait-ms})
   * @return the ask, whose answer the admin's call waits for
   */
  public Ask ask(Caller caller, String sessionId, int level, List<String> tags, boolean wake, long waitMillis) {
    int checkedLevel = level == 0 ? 1 : level;
    if (!wake && checkedLevel != 1 && checkedLevel != 2) {
      throw new InvalidRequestException("level: " + level + " (expected: 1 to keep the contents in host memory, "
          + "2 to drop them)");
    }
    for (String tag : tags) {
      Validation.label("tags", tag);
    }
    Session session = directory.ofTenantOrAdmin(caller, sessionId);
    String name = "session " + session.id();
    if (!session.sleepHandler()) {
      throw new ConflictException(name + "'s client registered no sleep handler, so it cannot pause its work: an "
          + "admin may sleep only a session whose application opted in (GpuMemClient.onSleepAsked, "
          + "gm.on_sleep_asked); it can sleep itself");
    }
    SessionChannel channel = session.channel();
    if (channel == null) {
      throw new ConflictException(name + " has no KeepAlive stream attached: its client cannot be asked now");
    }
    long asleep = session.sleepFigures()[0];
    if (!wake && asleep > 0) {
      throw new ConflictException(name + " sleeps already (" + asleep + " leases asleep): wake it first");
    }
    if (wake && asleep == 0) {
      throw new ConflictException(name + " is awake: nothing of it sleeps");
    }
    Ask ask = new Ask(ids.incrementAndGet(), session, wake, new CompletableFuture<>());
    Ask other = bySession.putIfAbsent(session.id(), ask);
    if (other != null) {
      throw new ConflictException(name + " is being asked to " + other.verb() + " already (admin request "
          + other.id() + "); try again once that has returned");
    }
    byId.put(ask.id(), ask);
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("admin", caller.principal())
        .log("{} asks the client of {} (tenant {}) to {} it{} (admin request {})", caller, session, session.tenant(),
            ask.verb(), wake ? "" : " at level " + checkedLevel + (tags.isEmpty() ? "" : ", tags " + tags), ask.id());
    CompletableFuture.delayedExecutor(waitMillis, TimeUnit.MILLISECONDS).execute(() -> {
      if (end(ask)) {
        log.warn("The client of {} did not answer admin request {} ({}) within {} ms", session, ask.id(), ask.verb(),
            waitMillis);
        ask.failed(new TimedOutException(name + "'s client did not answer the admin's " + ask.verb() + " within "
            + "--unmap-wait-ms=" + waitMillis + " ms (its application may still be pausing, or it hangs); nothing "
            + "changed, and a late answer is refused"));
      }
    });
    channel.sleepAsked(ask.id(), wake, checkedLevel, tags);
    return ask;
  }

  /**
   * The client's Sleep or Wake answering admin request {@code requestId}: the ask, now no longer
   * awaited (the caller completes it).
   *
   * @throws ConflictException when no such ask of this session and verb is awaited (it timed
   *     out, or was never made): the call is refused and changes nothing
   */
  public Ask claim(Caller caller, String sessionId, long requestId, boolean wake) {
    Session session = directory.session(caller, sessionId);
    Ask ask = byId.get(requestId);
    if (ask == null || ask.session() != session || ask.wake() != wake || !end(ask)) {
      throw new ConflictException("admin_request_id: " + Long.toUnsignedString(requestId) + " is not an admin's "
          + (wake ? "wake" : "sleep") + " of session " + sessionId + " awaiting its answer (it timed out, and the "
          + "admin was told that nothing changed); nothing changed");
    }
    return ask;
  }

  /** Ends an ask: true for the one caller that does (its claim or its timeout). */
  private boolean end(Ask ask) {
    if (!byId.remove(ask.id(), ask)) {
      return false;
    }
    bySession.remove(ask.session().id(), ask);
    return true;
  }

  /** Asks awaiting their client's answer now (for tests and listings). */
  public int awaiting() {
    return byId.size();
  }
}
