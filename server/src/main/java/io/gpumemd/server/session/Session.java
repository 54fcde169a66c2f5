package io.gpumemd.server.session;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A client's connection-scoped identity and what it holds. It belongs to the tenant of the
 * {@link Caller} that opened it, and its KeepAlive stream is pinned to one origin. Created and ended by the {@link
 * SessionRegistry}; every state change goes through a method of this class.
 *
 * <p>Thread-safety: the lease set, byte counts, the ended flag and the KeepAlive stream state
 * (channel, when it detached, whether there ever was one) are guarded by the session's
 * monitor, so that attaching a stream, detaching one and ending the session are atomic with
 * respect to each other. {@code lastSeenNanos} is volatile: every call refreshes it, and a lost
 * race between two refreshes costs nothing.
 */
public final class Session {
  private final String id;
  private final Caller owner;
  private final Tenant tenant;
  private final SegmentOwner segmentOwner;
  private final String clientName;
  private final int ttlSeconds;
  private final Quota quota;
  private final long openedNanos;
  private volatile long lastSeenNanos;

  // guarded by this
  private SessionChannel channel;
  /** Where the current stream comes from ({@link Caller#origin}); meaningful while channel != null. */
  private String channelOrigin;
  /** When the last stream detached; meaningful while {@code channel == null && hadStream}. */
  private long detachedNanos;
  private boolean hadStream;
  private final Map<String, LeaseRecord> leases = new HashMap<>();
  private long leasedBytes;
  /** Of leasedBytes, the bytes of leases the client keeps closed in its cache tier. */
  private long clientCachedBytes;
  /** The allowance granted at open, and the one in force (0 while the client is distrusted). */
  private final long grantedCacheBytes;
  private long cacheAllowance;
  private boolean cacheReturnOverdue;
  /** The client's cumulative cache counters as last reported, by device: {hits, returns}. */
  private final Map<Integer, long[]> reportedCounters = new HashMap<>(2);
  /** Leases held or being made, and their bytes, against the session's quota. */
  private final QuotaCount quotaUsage;
  /** Holds on other leases' blocks (Attach, Lookup), in {@code leases} too, and their bytes. */
  private long attachedHolds;
  private long attachedBytes;
  private long reservedHolds;
  private boolean ended;
  /**
   * KeepAlive messages applied, over all the session's streams and, once restored, those of the daemon it was written down in:
   * told to a reattaching client, which sends again those after it (StreamAttached.applied_messages).
   */
  private long appliedMessages;

  Session(String id, Caller owner, Tenant tenant, SegmentOwner segmentOwner, String clientName, int ttlSeconds,
      Quota quota, long cacheAllowance, long nowNanos) {
    this.owner = owner;
    this.tenant = tenant;
    this.segmentOwner = segmentOwner;
    this.grantedCacheBytes = cacheAllowance;
    this.cacheAllowance = cacheAllowance;
    this.id = id;
    this.clientName = clientName;
    this.ttlSeconds = ttlSeconds;
    this.quota = quota;
    this.quotaUsage = new QuotaCount(new QuotaCount.Label("session", "", "", "--quota-max-leases or quota."
        + clientName + ".max-leases", "--quota-max-leased-bytes or quota." + clientName + ".max-leased-bytes"));
    this.openedNanos = nowNanos;
    this.lastSeenNanos = nowNanos;
  }

  public String id() {
    return id;
  }

  /** Who opened the session; its tenant owns it. */
  public Caller owner() {
    return owner;
  }

  public String tenant() {
    return owner.tenant();
  }

  Tenant tenantUsage() {
    return tenant;
  }

  /** The owner of the segments this session's blocks are carved from. */
  public SegmentOwner segmentOwner() {
    return segmentOwner;
  }

  public String clientName() {
    return clientName;
  }

  public int ttlSeconds() {
    return ttlSeconds;
  }

  public Quota quota() {
    return quota;
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

  /** Sets the count of a snapshot (restore). */
  synchronized void restoreAppliedMessages(long count) {
    appliedMessages = count;
  }

  // ----------------------------------------------------------------- snapshot, restore

  /**
   * The session's own state as a snapshot needs it, read together under this monitor. Instants are this process's ticker nanos.
   *
   * @param counters the client's counters by device: {hits, returns}, copies
   * @param clientCached whether the client keeps each of its leases and holds (by id) cached
   */
  record Exported(long lastSeenNanos, boolean hadStream, boolean streamAttached, long detachedNanos,
      long grantedCacheBytes, long cacheAllowance, boolean cacheReturnOverdue, Map<Integer, long[]> counters,
      long appliedMessages, Map<String, Boolean> clientCached) {}

  synchronized Exported exportState() {
    Map<Integer, long[]> counters = new HashMap<>();
    reportedCounters.forEach((device, c) -> counters.put(device, c.clone()));
    Map<String, Boolean> cached = new HashMap<>();
    leases.values().forEach(r -> cached.put(r.id(), r.clientCached));
    return new Exported(lastSeenNanos, hadStream, channel != null, detachedNanos, grantedCacheBytes,
        cacheAllowance, cacheReturnOverdue, counters, appliedMessages, cached);
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
    this.cacheAllowance = cacheAllowance;
    this.cacheReturnOverdue = cacheReturnOverdue;
    counters.forEach((device, c) -> reportedCounters.put(device, new long[] {c[0], c[1]}));
    restoreAppliedMessages(appliedMessages);
  }

  /**
   * Adds a lease or hold of a snapshot, on a session not yet live
   * (restore): counted as {@link #commit} and {@link #commitHold} count, but never
   * refused, because memory that is leased stays leased whatever the quota says now.
   */
  synchronized void restoreRecord(LeaseRecord record) {
    if (leases.putIfAbsent(record.id(), record) != null) {
      throw new IllegalStateException(this + ": lease " + record.id() + " twice");
    }
    long size = record.block().size();
    if (record.attached()) {
      attachedHolds++;
      attachedBytes += size;
      return;
    }
    quotaUsage.add(size);
    leasedBytes += size;
    if (record.clientCached) {
      clientCachedBytes += size;
    }
  }

  /** Leases counted against the session's quota, and their bytes: {leases, bytes}. */
  synchronized long[] quotaUsage() {
    return new long[] {quotaUsage.leases(), quotaUsage.bytes()};
  }

  public synchronized boolean streamAttached() {
    return channel != null;
  }

  /**
   * Live leases, the bytes they hold, of those the client-cached bytes, then the attached holds
   * and their bytes, read together.
   */
  public synchronized long[] holdings() {
    return new long[] {leases.size() - attachedHolds, leasedBytes, clientCachedBytes, attachedHolds, attachedBytes};
  }

  /** The client cache allowance in force (0 = none, or withdrawn). */
  public synchronized long cacheAllowance() {
    return cacheAllowance;
  }

  /**
   * The client's cache counters as last reported, summed over devices: {hits, returns}, each
   * saturating at {@link Long#MAX_VALUE} (every device's value may be as large as a long).
   */
  public synchronized long[] clientCounters() {
    long[] sum = new long[2];
    for (long[] c : reportedCounters.values()) {
      sum[0] = saturatedSum(sum[0], c[0]);
      sum[1] = saturatedSum(sum[1], c[1]);
    }
    return sum;
  }

  /** {@code a + b} for non-negative operands, {@link Long#MAX_VALUE} where that would wrap. */
  private static long saturatedSum(long a, long b) {
    long sum = a + b;
    return sum < 0 ? Long.MAX_VALUE : sum;
  }

  // ------------------------------------------------------------------------ client cache

  /**
   * The client kept a lease in its cache tier: counted as client-cached if it is a leased
   * block of this session in use and fits the allowance in force.
   */
  synchronized CacheAnswer markCached(LeaseRecord lease) {
    // A shared block or a hold on one is never the client's to reuse: others still use it.
    if (ended || leases.get(lease.id()) != lease || lease.clientCached || lease.attached() || lease.shared() != null) {
      return CacheAnswer.NOT_CACHEABLE;
    }
    // What a client says it caches is held to what was granted: its cached bytes are memory
    // the daemon counts on getting back at once when it asks.
    if (clientCachedBytes + lease.block().size() > cacheAllowance) {
      return CacheAnswer.OVER_ALLOWANCE;
    }
    lease.clientCached = true;
    clientCachedBytes += lease.block().size();
    return CacheAnswer.CACHED;
  }

  /** What became of a lease the client says it closed into its cache. */
  enum CacheAnswer { CACHED, NOT_CACHEABLE, OVER_ALLOWANCE }

  /** Bytes of leases the client keeps closed in its cache tier. */
  synchronized long clientCachedBytes() {
    return clientCachedBytes;
  }

  /**
   * The client handed a cached lease out again.
   *
   * @return false when the lease is not this session's client-cached lease
   */
  synchronized boolean markReused(LeaseRecord lease) {
    if (ended || leases.get(lease.id()) != lease || !lease.clientCached) {
      return false;
    }
    lease.clientCached = false;
    clientCachedBytes -= lease.block().size();
    return true;
  }

  /**
   * Takes a client's cumulative counters for a device and returns what is new since the last
   * report: {hits, returns}, never negative. A counter that goes backwards (a confused client)
   * adds nothing, and a negative one is no count at all: it is ignored, the last valid value
   * stands, and the caller says so. The values kept are the highest valid ones reported, never
   * negative, so a delta (a valid report less a kept value) never overflows.
   */
  synchronized long[] counterDeltas(int device, long hits, long returns) {
    long[] last = reportedCounters.computeIfAbsent(device, d -> new long[2]);
    return new long[] {advance(last, 0, hits), advance(last, 1, returns)};
  }

  private static long advance(long[] last, int i, long reported) {
    if (reported <= last[i]) { // backwards, repeated, or negative (last[i] >= 0)
      return 0;
    }
    long delta = reported - last[i]; // both non-negative: cannot overflow
    last[i] = reported;
    return delta;
  }

  /**
   * The client did not give back cached blocks in time: withdraw its allowance.
   *
   * @return true when this changed it (the client is to be told)
   */
  synchronized boolean distrust() {
    if (cacheReturnOverdue || ended) {
      return false;
    }
    cacheReturnOverdue = true;
    cacheAllowance = 0;
    return true;
  }

  /**
   * After a release: a distrusted client that now holds nothing cached gets its allowance back.
   *
   * @return the restored allowance, or -1 when nothing changed
   */
  synchronized long restoreTrustIfReturned() {
    if (!cacheReturnOverdue || clientCachedBytes > 0 || ended) {
      return -1;
    }
    cacheReturnOverdue = false;
    cacheAllowance = grantedCacheBytes;
    return cacheAllowance;
  }

  synchronized boolean ended() {
    return ended;
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
    if (ended) {
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
    if (channel != null || ended) {
      return null;
    }
    if (hadStream) {
      long away = nowNanos - detachedNanos;
      return away > graceNanos ? "KeepAlive stream closed " + away / 1_000_000 + " ms ago" : null;
    }
    return nowNanos - lastSeenNanos > TimeUnit.SECONDS.toNanos(ttlSeconds)
        ? "TTL of " + ttlSeconds + " s expired without keep-alive" : null;
  }

  // ------------------------------------------------------------------------ leases and quota

  /**
   * Counts a lease about to be made against the session's quota ({@link Reservation} gives it
   * back or commits it).
   *
   * @throws ExhaustedException naming the quota, having counted nothing
   * @throws IllegalStateException when the session has ended
   */
  synchronized void reserve(long bytes) {
    if (ended) {
      throw new IllegalStateException(this + " has ended");
    }
    quotaUsage.take(bytes, quota, this + ": ");
  }

  synchronized void unreserve(long bytes) {
    quotaUsage.give(bytes);
  }

  /** Turns a reservation into a held lease; false, the reservation given back, if the session ended meanwhile. */
  synchronized boolean commit(LeaseRecord lease, long reserved) {
    if (ended) {
      quotaUsage.give(reserved);
      return false;
    }
    quotaUsage.resize(lease.block().size() - reserved);
    leases.put(lease.id(), lease);
    leasedBytes += lease.block().size();
    return true;
  }

  // ------------------------------------------------------------------------ sharing

  /**
   * The holds on a lease's block, sharing it first, under this monitor so that the client
   * cannot cache the lease meanwhile ({@link #markCached}).
   *
   * @return null when the lease is no longer this session's
   * @throws ConflictException when the client keeps the lease closed in its cache tier
   */
  synchronized SharedBlock shareable(LeaseRecord lease, Runnable onFirstShare) {
    if (ended || leases.get(lease.id()) != lease) {
      return null;
    }
    if (lease.clientCached) {
      throw new ConflictException("lease " + lease.id() + " is closed in the client's cache tier; "
          + "only a lease in use can be shared or published");
    }
    return lease.shareable(onFirstShare);
  }

  /**
   * Reserves a place for a hold about to be taken.
   *
   * @throws ExhaustedException at {@code maxHolds}, having reserved nothing
   * @throws IllegalStateException when the session has ended
   */
  synchronized void reserveHold(int maxHolds) {
    if (ended) {
      throw new IllegalStateException(this + " has ended");
    }
    if (maxHolds > 0 && attachedHolds + reservedHolds >= maxHolds) {
      throw new ExhaustedException(this + ": at most " + maxHolds + " holds per session by Attach and Lookup "
          + "(flag --max-holds-per-session); " + attachedHolds + " held");
    }
    reservedHolds++;
  }

  synchronized void unreserveHold() {
    reservedHolds--;
  }

  /** Turns a hold reservation into a held hold; false if the session ended meanwhile. */
  synchronized boolean commitHold(LeaseRecord hold) {
    reservedHolds--;
    if (ended) {
      return false;
    }
    leases.put(hold.id(), hold);
    attachedHolds++;
    attachedBytes += hold.block().size();
    return true;
  }

  synchronized void forget(LeaseRecord lease) {
    if (lease.attached()) {
      if (leases.remove(lease.id()) != null) {
        attachedHolds--;
        attachedBytes -= lease.block().size();
      }
      return;
    }
    if (leases.remove(lease.id()) != null) {
      leasedBytes -= lease.block().size();
      quotaUsage.give(lease.block().size());
      if (lease.clientCached) {
        clientCachedBytes -= lease.block().size();
      }
    }
  }

  /**
   * What the session holds in a segment (leases and holds alike, client-cached leases
   * included), or null when it holds nothing there.
   */
  synchronized SegmentHolding holding(long segmentId) {
    SegmentHolding found = null;
    for (LeaseRecord record : leases.values()) {
      if (record.block().segmentId() == segmentId) {
        found = new SegmentHolding(segmentId, record.block().memory(), !record.readOnly());
        if (found.writable()) {
          break;
        }
      }
    }
    return found;
  }

  /** What {@link #end} hands over: the leases it held and the stream to close (or null). */
  record Ending(List<LeaseRecord> leases, SessionChannel channel) {}

  /** Marks the session ended and hands over its leases and stream; null if it had already ended. */
  synchronized Ending end() {
    if (ended) {
      return null;
    }
    ended = true;
    List<LeaseRecord> held = new ArrayList<>(leases.values());
    leases.clear();
    leasedBytes = 0;
    clientCachedBytes = 0;
    attachedHolds = 0;
    attachedBytes = 0;
    SessionChannel stream = channel;
    channel = null;
    return new Ending(held, stream);
  }

  @Override
  public String toString() {
    return "session " + id.substring(0, 8) + " ('" + clientName + "')";
  }
}
