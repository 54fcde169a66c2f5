package io.gpumemd.server.books;

import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.pool.Block;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;

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
 * <p>Thread-safety: all state is guarded by this object's monitor; every method is short and
 * calls nothing outside.
 */
public final class SharedBlock {
  private final Block block;
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

  public Block block() {
    return block;
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

  /** @return false when the block already went back (nothing to hold) */
  public synchronized boolean addRecord(LeaseRecord hold) {
    if (returned) {
      return false;
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
    return records.remove(record) && lastGone();
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
