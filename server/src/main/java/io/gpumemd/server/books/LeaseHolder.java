package io.gpumemd.server.books;

import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The books of one session: the leases and holds it has, their bytes, of those the bytes its
 * client keeps closed in its cache tier and the allowance for them, its quota count, its holds
 * on shared blocks and the client's cache counters. The session lifecycle ({@code
 * io.gpumemd.server.session.Session}) extends it with the KeepAlive stream and the TTL; what a
 * lease or hold is, how it is counted and how it is given back is decided here and in the
 * {@link LeaseBook}, which the session layer calls without knowing the books' rules.
 *
 * <p>Why a superclass and not a part: ending a session and committing a lease must be atomic
 * with respect to each other (a lease recorded into an ended session is given back, never
 * lost), and so must sharing a lease and the client caching it. One object, one monitor: every
 * state change here is guarded by {@code this}, the same monitor that guards the session's
 * stream state, so {@code Session#end} takes the leases and marks the end in one step.
 *
 * <p>Thread-safety: all state is guarded by this object's monitor; every method is short and
 * calls nothing outside but the {@link LeaseRecord}'s own monitor (lock order: holder, then
 * record).
 */
public abstract class LeaseHolder {
  private final String id;
  private final String tenantKey;
  private final Tenant tenant;
  private final String clientName;
  private final Quota quota;

  // guarded by this
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
  /** True from a sleep until the wake of every lease; leases are refused meanwhile. */
  private boolean sleeping;
  /** True while a Sleep or Wake of this session runs. */
  private boolean sleepChanging;

  /**
   * @param tenantKey the tenant the session belongs to
   * @param tenant that tenant's holdings, which its quota is checked against
   * @param cacheAllowance the client cache allowance granted at open
   */
  protected LeaseHolder(String id, String tenantKey, Tenant tenant, String clientName, Quota quota,
      long cacheAllowance) {
    this.id = id;
    this.tenantKey = tenantKey;
    this.tenant = tenant;
    this.clientName = clientName;
    this.quota = quota;
    this.grantedCacheBytes = cacheAllowance;
    this.cacheAllowance = cacheAllowance;
    this.quotaUsage = new QuotaCount(new QuotaCount.Label("session", "", "", "--quota-max-leases or quota."
        + clientName + ".max-leases", "--quota-max-leased-bytes or quota." + clientName + ".max-leased-bytes"));
  }

  public String id() {
    return id;
  }

  /** The tenant the session belongs to. */
  public String tenant() {
    return tenantKey;
  }

  /** The tenant's holdings, which its leases, holds and shares are counted against. */
  public Tenant tenantUsage() {
    return tenant;
  }

  public String clientName() {
    return clientName;
  }

  public Quota quota() {
    return quota;
  }

  /**
   * Tells the client its cache allowance is now {@code bytes} (its trust came back after it
   * gave back its cached blocks). Called outside this monitor; must not block.
   */
  protected abstract void cacheAllowanceRestored(long bytes);

  public synchronized boolean ended() {
    return ended;
  }

  /**
   * Marks the holder ended and takes every lease and hold it had: the caller gives them back.
   * Called under this monitor by the session ending, once.
   */
  protected final List<LeaseRecord> endHoldings() {
    assert Thread.holdsLock(this);
    ended = true;
    List<LeaseRecord> held = new ArrayList<>(leases.values());
    leases.clear();
    leasedBytes = 0;
    clientCachedBytes = 0;
    attachedHolds = 0;
    attachedBytes = 0;
    return held;
  }

  // ----------------------------------------------------------------- snapshot, restore

  /**
   * The books' own state as a snapshot needs it, read together under this monitor.
   *
   * @param counters the client's counters by device: {hits, returns}, copies
   * @param clientCached whether the client keeps each of its leases and holds (by id) cached
   */
  public record Books(long grantedCacheBytes, long cacheAllowance, boolean cacheReturnOverdue,
      Map<Integer, long[]> counters, Map<String, Boolean> clientCached) {}

  protected final synchronized Books exportBooks() {
    Map<Integer, long[]> counters = new HashMap<>();
    reportedCounters.forEach((device, c) -> counters.put(device, c.clone()));
    Map<String, Boolean> cached = new HashMap<>();
    leases.values().forEach(r -> cached.put(r.id(), r.clientCached));
    return new Books(grantedCacheBytes, cacheAllowance, cacheReturnOverdue, counters, cached);
  }

  /** Sets the books' state of a snapshot, on a session not yet live (a restore). */
  protected final synchronized void restoreBooks(long cacheAllowance, boolean cacheReturnOverdue,
      Map<Integer, long[]> counters) {
    this.cacheAllowance = cacheAllowance;
    this.cacheReturnOverdue = cacheReturnOverdue;
    counters.forEach((device, c) -> reportedCounters.put(device, new long[] {c[0], c[1]}));
  }

  /**
   * Adds a lease or hold of a snapshot, on a session not yet live (restore): counted as {@link
   * #commit} and {@link #commitHold} count, but never refused, because memory that is leased
   * stays leased whatever the quota says now.
   */
  public synchronized void restoreRecord(LeaseRecord record) {
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
  public synchronized long[] quotaUsage() {
    return new long[] {quotaUsage.leases(), quotaUsage.bytes()};
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
    if (ended || leases.get(lease.id()) != lease || lease.clientCached || lease.attached() || lease.shared() != null
        || lease.asleep() != null) {
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
  public synchronized boolean distrust() {
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
    if (sleeping || sleepChanging) {
      throw new ConflictException(this + " is asleep (Allocator.Sleep): it leases again once it is woken (Wake)");
    }
    quotaUsage.take(bytes, quota, this);
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

  // ------------------------------------------------------------------------ holds

  /**
   * The holds on a lease's block, sharing it first, under this monitor so that the client
   * cannot cache the lease meanwhile ({@link #markCached}).
   *
   * @return null when the lease is no longer this session's
   * @throws ConflictException when the client keeps the lease closed in its cache tier
   */
  public synchronized SharedBlock shareable(LeaseRecord lease, Runnable onFirstShare) {
    if (ended || leases.get(lease.id()) != lease) {
      return null;
    }
    if (lease.clientCached) {
      throw new ConflictException("lease " + lease.id() + " is closed in the client's cache tier; "
          + "only a lease in use can be shared or published");
    }
    if (lease.asleep() != null) {
      throw new ConflictException("lease " + lease.id() + " is asleep (Allocator.Sleep); wake the session before "
          + "sharing or publishing it");
    }
    if (sleepChanging) {
      // A sleep closes the shared blocks it frees before it waits for their holders; a block
      // shared meanwhile would escape it.
      throw new ConflictException(this + ": a Sleep or Wake of it is under way; share or publish lease "
          + lease.id() + " once it has returned");
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
  public synchronized SegmentHolding holding(long segmentId) {
    SegmentHolding found = null;
    for (LeaseRecord record : leases.values()) {
      // A sleeping lease's segment was freed (or serves others): nothing of it is to be had.
      if (record.block().segmentId() == segmentId && record.asleep() == null) {
        found = new SegmentHolding(segmentId, record.block().memory(), !record.readOnly());
        if (found.writable()) {
          break;
        }
      }
    }
    return found;
  }

  // ------------------------------------------------------------------------ sleep and wake

  /**
   * A Sleep or Wake of this session starts: leases are refused until it ends.
   *
   * @return the session's leases and holds, a copy
   * @throws ConflictException when another one runs
   * @throws IllegalStateException when the session has ended
   */
  public synchronized List<LeaseRecord> beginSleepChange() {
    if (ended) {
      throw new IllegalStateException(this + " has ended");
    }
    if (sleepChanging) {
      throw new ConflictException(this + ": a Sleep or Wake of it is under way; try again once it has returned");
    }
    sleepChanging = true;
    return new ArrayList<>(leases.values());
  }

  /** The Sleep or Wake ended; {@code asleep} says whether any lease of the session sleeps now. */
  public synchronized void endSleepChange(boolean asleep) {
    sleepChanging = false;
    sleeping = asleep;
  }

  /** Whether the client keeps a lease of this session closed in its cache tier. */
  public synchronized boolean keepsCached(LeaseRecord lease) {
    return lease.clientCached;
  }

  /** {sleeping leases, bytes of their contents in host memory}. */
  public synchronized long[] sleepFigures() {
    long count = 0;
    long hostBytes = 0;
    if (sleeping || sleepChanging) {
      for (LeaseRecord record : leases.values()) {
        LeaseRecord.Asleep asleep = record.asleep();
        if (asleep != null) {
          count++;
          hostBytes += asleep.hostBytes();
        }
      }
    }
    return new long[] {count, hostBytes};
  }

  @Override
  public String toString() {
    return "session " + id.substring(0, 8) + " ('" + clientName + "')";
  }
}
