package io.gpumemd.server.books;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.offload.ParkedRange;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The holds on one shared block: the lease and the attached holds of live sessions ({@link
 * LeaseRecord}s), the valid share tokens, and the published names. The block stays leased in
 * its pool while any hold remains; the call that drops the last one learns it (a {@code true}
 * answer) and gives the block back, exactly once. After that, no hold can be added.
 *
 * <p>Completion events of holders that released before the last one are kept, so the block is
 * reused only once every holder's GPU work on it has completed (README, "The rules that keep
 * memory safe", rule 3, for several holders).
 *
 * <p>A block whose only holds are its names can be <i>parked</i> (Admin.ParkObject, {@code
 * --park-idle-objects}): its contents go to the host store, its memory back to the pool, and the
 * block becomes the place it was (a detached copy, for its device and size) until the next
 * Lookup restores it into a new block ({@link #restored}). While parked it takes no record.
 *
 * <p>A block can also sleep with its lease (Allocator.Sleep, issue 35 item 4): the sleep closes
 * it to new holds ({@link #closeForSleep}), waits for the other sessions' holds to go ({@link
 * #awaitAlone}), and frees it ({@link #fallAsleep}); its tokens and names stay, and refuse to
 * attach or look up until the wake ({@link #wake}) puts it in the lease's new block. Its lease
 * released while asleep leaves it <i>orphaned</i>: its tokens and names hold nothing any more.
 *
 * <p>Thread-safety: all state is guarded by this object's monitor; every method is short and
 * calls nothing outside but the pool's counters (lock order below). {@link #awaitAlone} waits
 * on the monitor, which the wait gives up, so the releases it waits for are not held up. Parking, restoring and dropping a parked block's last name also take
 * {@link #residency()} first, and hold it across their copies, which the monitor never is. Lock
 * order: residency, then this monitor, then the pool's lock.
 */
public final class SharedBlock {
  private Block block;
  /** The contents while parked, else null. */
  private ParkedRange parked;
  private final ReentrantLock residency = new ReentrantLock();
  /** When it was last looked up (or published): idle objects are parked least recently used first. */
  private volatile long lastUsedNanos;
  private final long sizeBytes;
  /** The leasing session's tenant: its quota carries the block until it returns. */
  private final Tenant leasedBy;
  /** The leasing session's id (it may have ended since), for the snapshot. */
  private final String leasedBySessionId;
  private final Set<LeaseRecord> records = new LinkedHashSet<>();
  private final Set<String> names = new TreeSet<>();
  private final List<CompletionEvent> events = new ArrayList<>(0);
  private int tokens;
  private boolean returned;
  /**
   * The session its lease sleeps with (as refusals name it), from the moment that sleep closes
   * the block to new holds until it wakes; else null.
   */
  private String sleeper;
  /** True while the block sleeps with its lease: its memory went back to the pool. */
  private boolean asleep;
  /** True once the lease was released while asleep: its contents went with it. */
  private boolean orphaned;

  SharedBlock(LeaseRecord lease) {
    this(lease.block(), lease.sizeBytes(), lease.session().tenantUsage(), lease.session().id());
    records.add(lease);
  }

  /**
   * A shared block as restored from a snapshot: its holds are added by
   * {@link #addRecord}, {@link #addToken} and {@link #addName}.
   */
  public SharedBlock(Block block, long sizeBytes, Tenant leasedBy, String leasedBySessionId) {
    this.block = block;
    this.sizeBytes = sizeBytes;
    this.leasedBy = leasedBy;
    this.leasedBySessionId = leasedBySessionId;
  }

  /** The leased block; while parked, where it was (for its device and size only). */
  public synchronized Block block() {
    return block;
  }

  /**
   * Orders parking, restoring, lookups and the drop of a parked block's last name: held across
   * the copies in and out of the host store, so concurrent lookups of a parked object restore it
   * once. Taken before this monitor, never while holding it.
   */
  public ReentrantLock residency() {
    return residency;
  }

  /** True while the contents are in the host store and the block is no longer leased. */
  public synchronized boolean parked() {
    return parked != null;
  }

  /** The parked contents, or null when not parked. */
  public synchronized ParkedRange parkedRange() {
    return parked;
  }

  /**
   * Why the block cannot be parked, naming who holds it, or null when only its names do. With
   * {@link #residency()} held: no lookup can add a record until it is released.
   */
  public synchronized String parkRefusal() {
    if (returned) {
      return "it was unpublished meanwhile";
    }
    if (sleeper != null) {
      return sleepRefusal("it");
    }
    if (records.isEmpty() && tokens == 0) {
      return null;
    }
    List<String> sessions = new ArrayList<>();
    for (LeaseRecord r : records) {
      String who = r.session().toString() + (r.attached() ? " (hold " : " (lease ") + r.id() + ")";
      if (!sessions.contains(who)) {
        sessions.add(who);
      }
    }
    return "it is held by " + (sessions.isEmpty() ? "no session" : String.join(", ", sessions))
        + (tokens == 0 ? "" : " and " + tokens + " share token(s)") + ": release the holds and revoke the tokens "
        + "first (only a block nobody but its names holds can be parked)";
  }

  /** The contents are parked: no record may be added until {@link #restored}. With {@link #residency()} held. */
  public synchronized void park(ParkedRange contents) {
    assert residency.isHeldByCurrentThread();
    if (returned || !records.isEmpty() || tokens != 0) {
      throw new IllegalStateException("parking a block that others hold: " + block);
    }
    parked = contents;
  }

  /** The pool took the memory back; {@code place} is where it was. With {@link #residency()} held. */
  public synchronized void freed(Block place) {
    block = place;
  }

  /** Restored into {@code fresh}: leased again, no longer parked. With {@link #residency()} held. */
  public synchronized void restored(Block fresh) {
    assert residency.isHeldByCurrentThread();
    block = fresh;
    parked = null;
  }

  /**
   * The last name of a parked block went: drops its contents and the leasing tenant's quota of
   * it (what giving the block back does for a leased one). With {@link #residency()} held.
   */
  public void dropParked() {
    ParkedRange contents;
    synchronized (this) {
      contents = parked;
      parked = null;
    }
    if (contents != null) {
      contents.drop();
      leasedBy.unreserve(SizeClasses.roundUp(sizeBytes));
    }
  }

  /** A lookup at {@code nanos} (the daemon's ticker). */
  public void used(long nanos) {
    lastUsedNanos = nanos;
  }

  public long lastUsedNanos() {
    return lastUsedNanos;
  }

  /** The names of the block, in order. */
  public synchronized List<String> names() {
    return List.copyOf(names);
  }

  /** Closes and forgets the completion events kept (parking: every one has completed). */
  public void closeKeptEvents() {
    List<CompletionEvent> all;
    synchronized (this) {
      all = List.copyOf(events);
      events.clear();
    }
    all.forEach(CompletionEvent::close);
  }

  /** Bytes requested by the lease that was shared. */
  public long sizeBytes() {
    return sizeBytes;
  }

  /** The tenant of the session that leased the block: its quota carries the block until it returns. */
  public Tenant leasedBy() {
    return leasedBy;
  }

  /** The id of the session that leased the block (it may have ended since). */
  public String leasedBySessionId() {
    return leasedBySessionId;
  }

  /** What {@link #snapshot} reads: the records in hold order, the names, the tokens. */
  public record Holds(List<LeaseRecord> records, List<String> names, int tokens, boolean returned) {}

  /** The holds, read together (snapshot). */
  public synchronized Holds snapshot() {
    return new Holds(List.copyOf(records), List.copyOf(names), tokens, returned);
  }

  /**
   * The completion events kept from holders that released it, a copy (snapshot: they
   * are queried outside this monitor, which calls nothing outside).
   */
  public synchronized List<CompletionEvent> keptEvents() {
    return List.copyOf(events);
  }

  /**
   * @return false when the block already went back (nothing to hold)
   * @throws ConflictException while it sleeps with its lease (or a sleep has closed it)
   */
  public synchronized boolean addRecord(LeaseRecord hold) {
    if (returned) {
      return false;
    }
    String refusal = sleepRefusal(name().isEmpty() ? "the shared block" : "object '" + name() + "'");
    if (refusal != null) {
      throw new ConflictException(refusal);
    }
    if (parked != null) {
      // Lookups restore a parked block before they hold it, under the residency lock.
      throw new IllegalStateException("a hold on a parked block: " + block);
    }
    records.add(hold);
    return true;
  }

  /** @return false when the block already went back */
  public synchronized boolean addToken() {
    if (returned) {
      return false;
    }
    tokens++;
    return true;
  }

  /** @return -1 when the block already went back, else the names it had before (0 = first) */
  public synchronized int addName(String name) {
    if (returned || !names.add(name)) {
      return -1;
    }
    return names.size() - 1;
  }

  /**
   * A lease or hold of a session is released, after its holder's last GPU use when {@code
   * event} is given (kept until the block goes back).
   *
   * @return true when it was the last hold: the caller gives the block back
   */
  synchronized boolean dropRecord(LeaseRecord record, CompletionEvent event) {
    if (event != null) {
      events.add(event);
    }
    boolean removed = records.remove(record);
    if (removed && sleeper != null) {
      notifyAll(); // a sleep may be waiting for this hold to go (awaitAlone)
    }
    return removed && lastGone();
  }

  /** @return true when it was the last hold */
  public synchronized boolean dropToken() {
    tokens--;
    return lastGone();
  }

  /** What dropping a name did: whether it was the block's last name, and its last hold. */
  public record NameDrop(boolean lastName, boolean lastHold) {}

  public synchronized NameDrop dropName(String name) {
    names.remove(name);
    return new NameDrop(names.isEmpty(), lastGone());
  }

  private boolean lastGone() {
    if (!returned && records.isEmpty() && tokens == 0 && names.isEmpty()) {
      returned = true;
      return true;
    }
    return false;
  }

  /** The events of every holder that released with one, as one event; null when none did. */
  synchronized CompletionEvent takeEvents() {
    if (events.isEmpty()) {
      return null;
    }
    List<CompletionEvent> all = List.copyOf(events);
    events.clear();
    return all.size() == 1 ? all.get(0) : new AllEvents(all);
  }

  /** Holds on the block now: session records, tokens and names. */
  public synchronized int holds() {
    return records.size() + tokens + names.size();
  }

  /** Sessions holding the block now (lease and attached holds), each once, in hold order. */
  public synchronized List<String> holderSessionIds() {
    List<String> ids = new ArrayList<>(records.size());
    for (LeaseRecord r : records) {
      if (!ids.contains(r.session().id())) {
        ids.add(r.session().id());
      }
    }
    return ids;
  }

  /** The first of the block's published names, or "" when it has none. */
  public synchronized String name() {
    return names.isEmpty() ? "" : names.iterator().next();
  }

  /** True once the last hold is gone. */
  public synchronized boolean returned() {
    return returned;
  }

  // ------------------------------------------------------------------------------ sleep

  /**
   * Why a new hold is refused while the block sleeps with its lease, or null when it does not.
   *
   * @param what the block as the caller names it ("object 'w'", "the shared block")
   */
  public synchronized String sleepRefusal(String what) {
    if (orphaned) {
      return what + " slept with " + sleeper + ", which released it while asleep: its contents are gone; "
          + "unpublish it (or revoke its share tokens)";
    }
    if (sleeper != null) {
      return what + " sleeps with " + sleeper + " (Allocator.Sleep); it comes back when that session wakes";
    }
    return null;
  }

  /**
   * A sleep of the block's lease by {@code sleeper} (a session, as refusals name it) starts: from
   * now on no hold is added, until {@link #reopen} or the wake.
   */
  public synchronized void closeForSleep(String sleeper) {
    this.sleeper = sleeper;
  }

  /** The sleep that closed the block did not happen (refused, or the lease was released meanwhile). */
  public synchronized void reopen() {
    if (!asleep) {
      sleeper = null;
    }
  }

  /**
   * Waits until no session but {@code lease}'s holds the block, or until {@code deadlineNanos}
   * ({@link System#nanoTime}); each release of a hold wakes it ({@link #dropRecord}).
   *
   * @return the other holds left, as refusals name them ("session … (hold …)"); empty when none
   * @throws InterruptedException when interrupted (the call was cancelled)
   */
  public synchronized List<String> awaitAlone(LeaseRecord lease, long deadlineNanos) throws InterruptedException {
    while (true) {
      List<String> others = new ArrayList<>();
      for (LeaseRecord r : records) {
        if (r != lease) {
          others.add(r.session() + " (hold " + r.id() + ")");
        }
      }
      long left = deadlineNanos - System.nanoTime();
      if (others.isEmpty() || left <= 0) {
        return others;
      }
      TimeUnit.NANOSECONDS.timedWait(this, left);
    }
  }

  /**
   * The block goes to sleep with its lease (the pool frees it next, and {@link #freed} says
   * where it was): its names stop counting as published, keeping their room for the wake.
   */
  public synchronized void fallAsleep(DevicePool pool) {
    asleep = true;
    if (!names.isEmpty()) {
      pool.sleep().publishedAsleep(block, names.size());
    }
    pool.sharedBlockReturned();
  }

  /**
   * The sleeping lease wakes into {@code fresh}, and the block with it, under this monitor so
   * that a release of the lease comes wholly before (orphaned: the lease does not wake) or after.
   *
   * @return what {@link LeaseRecord#wake} returns
   */
  public synchronized LeaseRecord.Asleep wake(LeaseRecord lease, Block fresh, DevicePool pool) {
    LeaseRecord.Asleep was = lease.wake(fresh);
    if (was != null && asleep) {
      pool.blockShared(fresh);
      if (!names.isEmpty()) {
        pool.sleep().publishedAwake(fresh, names.size());
      }
      block = fresh;
      asleep = false;
      sleeper = null;
    }
    return was;
  }

  /** The sleeping lease was released: the tokens and names left hold nothing any more. */
  synchronized void orphan() {
    orphaned = true;
  }

  /** True while the block sleeps with its lease, or after its lease was released asleep. */
  public synchronized boolean asleep() {
    return asleep;
  }

  /** True once its lease was released while asleep: its last hold gives nothing back. */
  public synchronized boolean orphaned() {
    return orphaned;
  }

  /** Completes when all of several events have; closes them all. Polled from one thread. */
  private static final class AllEvents implements CompletionEvent {
    private final List<CompletionEvent> events;

    AllEvents(List<CompletionEvent> events) {
      this.events = events;
    }

    @Override
    public boolean isComplete() {
      for (CompletionEvent e : events) {
        if (!e.isComplete()) {
          return false;
        }
      }
      return true;
    }

    @Override
    public void close() {
      for (CompletionEvent e : events) {
        e.close();
      }
    }
  }
}
