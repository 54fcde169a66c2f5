package io.gpumemd.server.session;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.books.LeaseHolder;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.Tenant;
import io.gpumemd.server.error.ConflictException;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A client's connection-scoped identity and what it holds. It belongs to the tenant of the
 * {@link Caller} that opened it, and its KeepAlive stream is pinned to one origin. Created and ended by the {@link
 * SessionRegistry}; every state change goes through a method of this class.
 *
 * <p>What it holds (leases, holds, quota, client cache) is kept in its books, the {@link
 * LeaseHolder} it extends; this class adds the session's life: its KeepAlive stream, its TTL,
 * and its end.
 *
 * <p>Thread-safety: the books, the ended flag and the KeepAlive stream state (channel, when it
 * detached, whether there ever was one) are guarded by the session's monitor, so that
 * attaching a stream, detaching one and ending the session are atomic with respect to each
 * other. {@code lastSeenNanos} is volatile: every call refreshes it, and a lost
 * race between two refreshes costs nothing.
 */
public final class Session extends LeaseHolder {
  private final Caller owner;
  private final SegmentOwner segmentOwner;
  private final int ttlSeconds;
  private final long openedNanos;
  private volatile long lastSeenNanos;
  /** The client accepts an admin's sleep (KeepAliveRequest.sleep_handler): its application can pause. */
  private volatile boolean sleepHandler;

  // guarded by this
  private SessionChannel channel;
  /** Where the current stream comes from ({@link Caller#origin}); meaningful while channel != null. */
  private String channelOrigin;
  /** When the last stream detached; meaningful while {@code channel == null && hadStream}. */
  private long detachedNanos;
  private boolean hadStream;
  /**
   * KeepAlive messages applied, over all the session's streams and, once restored, those of the daemon it was written down in:
   * told to a reattaching client, which sends again those after it (StreamAttached.applied_messages).
   */
  private long appliedMessages;

  Session(String id, Caller owner, Tenant tenant, SegmentOwner segmentOwner, String clientName, int ttlSeconds,
      Quota quota, long cacheAllowance, long nowNanos) {
    super(id, owner.tenant(), tenant, clientName, quota, cacheAllowance);
    this.owner = owner;
    this.segmentOwner = segmentOwner;
    this.ttlSeconds = ttlSeconds;
    this.openedNanos = nowNanos;
    this.lastSeenNanos = nowNanos;
  }

  /** Sessions by age, then id (sessions opened in the same nanosecond): the order of listings and snapshots. */
  public static final Comparator<Session> ORDER =
      Comparator.comparingLong(Session::openedNanos).thenComparing(Session::id);

  /** Who opened the session; its tenant owns it. */
  public Caller owner() {
    return owner;
  }

  /** The owner of the segments this session's blocks are carved from. */
  public SegmentOwner segmentOwner() {
    return segmentOwner;
  }

  public int ttlSeconds() {
    return ttlSeconds;
  }

  public long openedNanos() {
    return openedNanos;
  }

  /** KeepAlive messages applied so far; see {@link #messageApplied}. */
  public synchronized long appliedMessages() {
    return appliedMessages;
  }

  /** One more KeepAlive message of this session was applied (called once it has been). */
  public synchronized void messageApplied() {
    appliedMessages++;
  }

  @Override
  protected void cacheAllowanceRestored(long bytes) {
    SessionChannel current = channel();
    if (current != null) {
      current.cacheAllowance(bytes);
    }
  }

  // ----------------------------------------------------------------- snapshot, restore

  /**
   * The session's own state as a snapshot needs it, read together under this monitor, with its
   * books ({@link LeaseHolder#exportBooks}). Instants are this process's ticker nanos.
   */
  record Exported(long lastSeenNanos, boolean hadStream, boolean streamAttached, long detachedNanos,
      long appliedMessages, Books books) {}

  synchronized Exported exportState() {
    return new Exported(lastSeenNanos, hadStream, channel != null, detachedNanos, appliedMessages, exportBooks());
  }

  /**
   * Sets the state of a snapshot, on a session not yet live (a
   * restore). It comes back detached: one that had a stream counts its grace from
   * {@code detachedNanos}, one that never had one its TTL from {@code lastSeenNanos}.
   */
  synchronized void restoreState(long lastSeenNanos, boolean hadStream, long detachedNanos, long cacheAllowance,
      boolean cacheReturnOverdue, Map<Integer, long[]> counters, long appliedMessages) {
    this.lastSeenNanos = lastSeenNanos;
    this.hadStream = hadStream;
    this.detachedNanos = detachedNanos;
    restoreBooks(cacheAllowance, cacheReturnOverdue, counters);
    this.appliedMessages = appliedMessages;
  }

  /** Whether the client said its application registered a sleep handler ({@link SleepAsks}). */
  public boolean sleepHandler() {
    return sleepHandler;
  }

  /** The client said whether its application has a sleep handler (the latest word counts). */
  public void sleepHandler(boolean registered) {
    sleepHandler = registered;
  }

  public synchronized boolean streamAttached() {
    return channel != null;
  }

  /** The client did something: its TTL starts again. */
  void touch(long nowNanos) {
    lastSeenNanos = nowNanos;
  }

  // ------------------------------------------------------------------------ KeepAlive stream

  /**
   * Makes {@code stream} the session's KeepAlive stream. A live stream is replaced only by one
   * from the same origin (the same process reconnecting); from anywhere else the new stream is
   * refused, so nobody can take a session over by knowing its id.
   *
   * @param origin where the new stream comes from ({@link Caller#origin})
   * @return the stream it replaces (to close), or null
   * @throws IllegalStateException when the session has ended: the stream must not outlive it
   * @throws ConflictException when another origin holds a live stream
   */
  synchronized SessionChannel attach(SessionChannel stream, String origin) {
    if (ended()) {
      throw new IllegalStateException(this + " has ended");
    }
    if (channel != null && channel != stream && !origin.equals(channelOrigin)) {
      throw new ConflictException(this + " already has a live KeepAlive stream from " + channelOrigin
          + "; a second stream from " + origin + " is refused (one stream per session)");
    }
    SessionChannel previous = channel;
    channel = stream;
    channelOrigin = origin;
    hadStream = true;
    return previous == stream ? null : previous;
  }

  /**
   * A stream went away. Only the session's current stream detaches it: a late detach of a
   * stream that a newer one replaced changes nothing.
   *
   * @return true when {@code stream} was the current stream
   */
  synchronized boolean detach(SessionChannel stream, long nowNanos) {
    if (channel != stream) {
      return false;
    }
    channel = null;
    detachedNanos = nowNanos;
    return true;
  }

  /** The current KeepAlive stream, or null. Events are sent on it outside this monitor. */
  synchronized SessionChannel channel() {
    return channel;
  }

  /**
   * Why the session should end now, or null: its stream stayed away past the grace period, or
   * it never had one and its TTL passed without a call.
   */
  synchronized String expiry(long nowNanos, long graceNanos) {
    if (channel != null || ended()) {
      return null;
    }
    if (hadStream) {
      long away = nowNanos - detachedNanos;
      return away > graceNanos ? "KeepAlive stream closed " + away / 1_000_000 + " ms ago" : null;
    }
    return nowNanos - lastSeenNanos > TimeUnit.SECONDS.toNanos(ttlSeconds)
        ? "TTL of " + ttlSeconds + " s expired without keep-alive" : null;
  }

  /** What {@link #end} hands over: the leases it held and the stream to close (or null). */
  record Ending(List<LeaseRecord> leases, SessionChannel channel) {}

  /** Marks the session ended and hands over its leases and stream; null if it had already ended. */
  synchronized Ending end() {
    if (ended()) {
      return null;
    }
    List<LeaseRecord> held = endHoldings();
    SessionChannel stream = channel;
    channel = null;
    return new Ending(held, stream);
  }
}
