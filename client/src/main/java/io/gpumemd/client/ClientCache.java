package io.gpumemd.client;

import io.gpumemd.common.SizeClasses;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.function.BooleanSupplier;

/**
 * The client cache tier: closed leases this process keeps mapped, to serve its next leases
 * without a round trip. The blocks stay the session's leases at the daemon (client-cached);
 * this class only decides which one serves a request and which ones go back.
 *
 * <h2>Algorithm</h2>
 *
 * <ol>
 *   <li><b>Offer</b> (a lease is closed): kept when it fits the allowance the daemon grants,
 *       making room by giving back the least recently cached leases; a block larger than the
 *       whole allowance is released instead.
 *   <li><b>Take</b> (a lease is asked for): the request is rounded up to 512 B, as the daemon
 *       does; best fit = the smallest cached block of the device at least that large, within the
 *       daemon's size classes ({@link SizeClasses#largestFit}): a request up to 1 MiB takes a
 *       block of at most 2 MiB (one small segment), a larger one a block at most the daemon's
 *       {@code --max-oversize-bytes} (told in OpenSessionResponse) larger than the request.
 *   <li><b>Give back</b> (the daemon asks, or the allowance shrinks): least recently cached
 *       first, until enough bytes are out.
 * </ol>
 *
 * <p>Counters (local hits and returns) are kept per device, cumulative, as the daemon wants
 * them reported.
 *
 * <p>A take or an offer and its notice to the daemon are one step: the {@link Listener} hears
 * of the move under this cache's lock, so that a close of the same block on another thread
 * cannot come between them (the notices would reach the daemon out of order). Once drained,
 * the cache takes and keeps nothing more: its session is gone.
 *
 * <p>Thread-safety: every method takes this cache's own lock, which nothing outside takes; the
 * critical sections are a tree look-up, a few field updates and the listener's map update.
 */
final class ClientCache {
  /** Hears, under the cache's lock, of every lease that moves in or out of it. */
  interface Listener {
    /** A closed lease was kept ({@code reused} false), or handed out again ({@code reused} true). */
    void moved(String leaseId, boolean reused);

    /**
     * A cached lease was removed to make room for another and is to be released: heard before
     * the other's {@link #moved}, so that the daemon, which holds cached bytes to the allowance,
     * never sees the newcomer before the room made for it.
     */
    void evicted(String leaseId);
  }

  /** A closed lease kept for reuse; {@code seq} orders by age. */
  private static final class Entry {
    final Lease lease;
    final long bytes;
    final long seq;

    Entry(Lease lease, long bytes, long seq) {
      this.lease = lease;
      this.bytes = bytes;
      this.seq = seq;
    }
  }

  private static final Comparator<Entry> BY_SIZE =
      Comparator.<Entry>comparingLong(e -> e.bytes).thenComparingLong(e -> e.seq);

  private final Object lock = new Object();
  private final Map<Integer, TreeSet<Entry>> bySize = new HashMap<>();
  /** Every entry, least recently cached first. */
  private final LinkedHashSet<Entry> byAge = new LinkedHashSet<>();
  private final Map<Integer, long[]> counters = new HashMap<>();
  private final long maxOversizeBytes;
  private long allowance;
  private long cachedBytes;
  private long seq;
  private long localHits;
  private long localReturns;
  private long countersVersion;
  private boolean drained;
  /** The session sleeps: nothing is kept (see {@link #suspend}). */
  private boolean suspended;
  private static final int ANY_DEVICE = -1;

  /** @param maxOversizeBytes the daemon's oversize rule, as its OpenSessionResponse says */
  ClientCache(long allowanceBytes, long maxOversizeBytes) {
    this.allowance = allowanceBytes;
    this.maxOversizeBytes = maxOversizeBytes;
  }

  /**
   * Keeps a closed lease if it fits the allowance, making room by removing least recently
   * cached ones; {@code listener} hears of it when kept.
   *
   * @return null when not kept (the caller releases it); else the leases removed to make room,
   *     usually none, whose release notices the listener has recorded (the caller unmaps them)
   */
  List<Lease> offer(Lease lease, Listener listener) {
    synchronized (lock) {
      if (drained || suspended || lease.blockBytes() > allowance) {
        return null;
      }
      List<Lease> evicted = removeOldest(ANY_DEVICE, () -> cachedBytes + lease.blockBytes() > allowance);
      for (Lease old : evicted) {
        listener.evicted(old.id());
      }
      Entry entry = new Entry(lease, lease.blockBytes(), seq++);
      bySize.computeIfAbsent(lease.device(), d -> new TreeSet<>(BY_SIZE)).add(entry);
      byAge.add(entry);
      cachedBytes += lease.blockBytes();
      localReturns++;
      counters.computeIfAbsent(lease.device(), d -> new long[2])[1]++;
      countersVersion++;
      listener.moved(lease.id(), false);
      return evicted;
    }
  }

  /**
   * The best-fitting cached lease for a request, removed from the cache, or null;
   * {@code listener} hears of it when one is taken.
   */
  Lease take(int device, long sizeBytes, Listener listener) {
    synchronized (lock) {
      TreeSet<Entry> index = bySize.get(device);
      if (index == null || index.isEmpty()) {
        return null;
      }
      long rounded = SizeClasses.roundUp(sizeBytes);
      Entry best = index.ceiling(new Entry(null, rounded, Long.MIN_VALUE));
      if (best == null || best.bytes > SizeClasses.largestFit(rounded, maxOversizeBytes)) {
        return null;
      }
      index.remove(best);
      byAge.remove(best);
      cachedBytes -= best.bytes;
      localHits++;
      counters.computeIfAbsent(device, d -> new long[2])[0]++;
      countersVersion++;
      listener.moved(best.lease.id(), true);
      return best.lease;
    }
  }

  /**
   * Removes least recently cached leases of a device until at least {@code bytes} are out, or
   * all of them when {@code bytes} is 0.
   */
  List<Lease> giveBack(int device, long bytes) {
    synchronized (lock) {
      long before = cachedBytes;
      return removeOldest(device, () -> bytes == 0 || before - cachedBytes < bytes);
    }
  }

  /**
   * The daemon refused to count a lease as cached (RESOURCE_EXHAUSTED: past the allowance it
   * holds the session to, which a notice sent before a lowered allowance arrived can meet): it
   * still counts the lease as in use, so the cache must not keep it.
   *
   * @return the lease, removed (the caller releases it), or null when it is not cached (handed
   *     out again since: in use at both ends, the books agree)
   */
  Lease refused(String leaseId) {
    synchronized (lock) {
      // A linear scan: refusals are rare, and the cache holds at most allowance / 512 B leases.
      Iterator<Entry> entries = byAge.iterator();
      while (entries.hasNext()) {
        Entry entry = entries.next();
        if (entry.lease.id().equals(leaseId)) {
          entries.remove();
          bySize.get(entry.lease.device()).remove(entry);
          cachedBytes -= entry.bytes;
          return entry.lease;
        }
      }
      return null;
    }
  }

  /** Sets the allowance and removes least recently cached leases until the cache fits it. */
  List<Lease> setAllowance(long bytes) {
    synchronized (lock) {
      allowance = bytes;
      return removeOldest(ANY_DEVICE, () -> cachedBytes > allowance);
    }
  }

  /** Removes least recently cached leases (of one device, or any) while {@code more} holds. */
  private List<Lease> removeOldest(int device, BooleanSupplier more) {
    assert Thread.holdsLock(lock);
    List<Lease> out = new ArrayList<>(0);
    Iterator<Entry> oldest = byAge.iterator();
    while (more.getAsBoolean() && oldest.hasNext()) {
      Entry entry = oldest.next();
      if (device != ANY_DEVICE && entry.lease.device() != device) {
        continue;
      }
      oldest.remove();
      bySize.get(entry.lease.device()).remove(entry);
      cachedBytes -= entry.bytes;
      out.add(entry.lease);
    }
    return out;
  }

  /**
   * Empties the cache for good (the session is lost, or the client is closing: the daemon
   * takes everything back); later offers and takes find nothing and keep nothing.
   */
  List<Lease> drain() {
    synchronized (lock) {
      drained = true;
      return removeAll();
    }
  }

  /**
   * Empties the cache until {@link #resume}: the session sleeps, and the caller releases what
   * was cached (nothing of a sleeping session is client-cached); closed leases are released
   * meanwhile, never kept (a sleeping one has no memory to serve).
   */
  List<Lease> suspend() {
    synchronized (lock) {
      suspended = true;
      return removeAll();
    }
  }

  /** The session is awake again: closed leases are kept again. */
  void resume() {
    synchronized (lock) {
      suspended = false;
    }
  }

  private List<Lease> removeAll() {
    assert Thread.holdsLock(lock);
    List<Lease> out = new ArrayList<>(byAge.size());
    for (Entry entry : byAge) {
      out.add(entry.lease);
    }
    byAge.clear();
    bySize.clear();
    cachedBytes = 0;
    return out;
  }

  long allowance() {
    synchronized (lock) {
      return allowance;
    }
  }

  long cachedBytes() {
    synchronized (lock) {
      return cachedBytes;
    }
  }

  int cachedBlocks() {
    synchronized (lock) {
      return byAge.size();
    }
  }

  long localHits() {
    synchronized (lock) {
      return localHits;
    }
  }

  long localReturns() {
    synchronized (lock) {
      return localReturns;
    }
  }

  /** Changes whenever a counter does: the client sends counters only after a change. */
  long countersVersion() {
    synchronized (lock) {
      return countersVersion;
    }
  }

  /** Cumulative {hits, returns} per device, a copy. */
  Map<Integer, long[]> counters() {
    synchronized (lock) {
      Map<Integer, long[]> copy = new HashMap<>();
      counters.forEach((device, c) -> copy.put(device, c.clone()));
      return copy;
    }
  }
}
