package io.gpumemd.server.session;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.books.Page;
import io.gpumemd.server.pool.HolderRequests;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The live sessions by id, and the way to reach their attached KeepAlive streams: the pools'
 * (an unmap request for a holder goes to that session's stream) and the daemon's notices to
 * every attached client (shutdown, a successor's socket, moving). Created before the pools and the {@link
 * SessionRegistry}, which both hold it, so neither needs the other at construction.
 *
 * <p>Thread-safe: a concurrent map; {@link #requestUnmap} never blocks.
 */
public final class LiveSessions implements HolderRequests {
  private static final Logger log = LoggerFactory.getLogger(LiveSessions.class);

  private final ConcurrentHashMap<String, Session> byId = new ConcurrentHashMap<>();
  /** Live sessions plus those being opened: what {@code --max-sessions} bounds. */
  private final AtomicInteger count = new AtomicInteger();

  /**
   * A page of live sessions by age, after the session that opened at {@code afterNanos} with id
   * {@code afterId} (null for the first page): every tenant's for an admin, else the caller's
   * tenant's only.
   */
  Page<Session> page(Caller caller, long afterNanos, String afterId, int size) {
    return Page.select(byId.values(), s -> caller.admin() || caller.owns(s.tenant()),
        s -> afterId == null || s.openedNanos() > afterNanos
            || (s.openedNanos() == afterNanos && s.id().compareTo(afterId) > 0),
        Session.ORDER, size);
  }

  /** Live sessions by age: every tenant's for an admin, else the caller's tenant's only. */
  List<Session> visibleTo(Caller caller) {
    List<Session> out = new ArrayList<>(byId.values());
    if (!caller.admin()) {
      out.removeIf(s -> !caller.owns(s.tenant()));
    }
    out.sort(Comparator.comparingLong(Session::openedNanos));
    return out;
  }

  Session get(String id) {
    return byId.get(id);
  }

  /**
   * Takes a place for a session about to open, within {@code max} (0 = no limit).
   *
   * @return false when {@code max} sessions are live or opening
   */
  boolean reserve(int max) {
    while (true) {
      int n = count.get();
      if (max > 0 && n >= max) {
        return false;
      }
      if (count.compareAndSet(n, n + 1)) {
        return true;
      }
    }
  }

  /** Gives back a place taken by {@link #reserve} for a session that did not open. */
  void unreserve() {
    count.decrementAndGet();
  }

  /** Adds a session whose place {@link #reserve} took. */
  void add(Session session) {
    byId.put(session.id(), session);
  }

  /**
   * Adds a session restored from a snapshot: it takes its place
   * whatever {@code --max-sessions} says now, because it holds memory that stays leased.
   */
  void restore(Session session) {
    count.incrementAndGet();
    byId.put(session.id(), session);
  }

  void remove(Session session) {
    if (byId.remove(session.id(), session)) {
      count.decrementAndGet();
    }
  }

  Collection<Session> all() {
    return byId.values();
  }

  public int size() {
    return byId.size();
  }

  /**
   * Gives {@code notice} to the channel of every session that has a stream attached (a stream
   * cancelled under it is skipped: its client reattaches anyway).
   *
   * @param what the notice's name, for the DEBUG line of one not sent
   * @return the sessions told
   */
  int tellAttached(String what, Consumer<SessionChannel> notice) {
    int told = 0;
    for (Session session : byId.values()) {
      SessionChannel channel = session.channel();
      try {
        if (channel != null) {
          notice.accept(channel);
          told++;
        }
      } catch (RuntimeException e) {
        log.debug("{} notice to {} not sent: {}", what, session, e.toString());
      }
    }
    return told;
  }

  /**
   * Waits until {@code expected} sessions have a stream attached, at most {@code maxMillis}: a
   * successor lets the clients it took over reattach before it finishes its own start. Polls
   * every millisecond (once per take-over; the sessions are one per client process).
   */
  void awaitStreams(int expected, long maxMillis) {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(maxMillis);
    while (expected > 0 && System.nanoTime() < deadline && !Thread.currentThread().isInterrupted()) {
      int attached = 0;
      for (Session session : byId.values()) {
        if (session.streamAttached()) {
          attached++;
        }
      }
      if (attached >= expected) {
        return;
      }
      LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(1));
    }
  }

  @Override
  public void requestCacheReturn(String holder, int device, long bytes) {
    Session session = byId.get(holder);
    SessionChannel channel = session == null ? null : session.channel();
    if (channel != null) {
      channel.returnCache(device, bytes);
    }
  }

  @Override
  public void cacheReturnOverdue(String holder) {
    Session session = byId.get(holder);
    if (session != null && session.distrust()) {
      log.warn("{} did not give back its client-cached blocks within the unmap wait: its client cache "
          + "allowance is withdrawn until it does", session);
      SessionChannel channel = session.channel();
      if (channel != null) {
        channel.cacheAllowance(0);
      }
    }
  }

  @Override
  public void requestUnmap(String holder, int device, long segmentId) {
    Session session = byId.get(holder);
    if (session == null) {
      return; // ended: the pool hears of it through holderEnded
    }
    SessionChannel channel = session.channel();
    if (channel != null) {
      channel.requestUnmap(device, segmentId);
    } else {
      log.debug("{}: segment {} waits for the session to end or reattach (no KeepAlive stream to ask)",
          session, segmentId);
    }
  }
}
