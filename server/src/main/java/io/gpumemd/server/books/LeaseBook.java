package io.gpumemd.server.books;

import io.gpumemd.common.Sizes;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.LeasedBlock;
import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.auth.Caller;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Every live lease and hold by id: the one place that records one for a session ({@link
 * #record}, {@link #hold}), finds it for its session, and gives its block back when it goes
 * ({@link #release}, {@link #returnAll}), to the pool and to its tenant's quota. Both the
 * session registry (leases, sessions ending) and sharing (holds by token or name) use it, so
 * neither calls the other.
 *
 * <p>Rules: only the owning session finds or releases a record; a foreign, unknown or repeated
 * id answers NOT_FOUND, the same for each, so ids are not probeable. A shared block goes back
 * with its last hold.
 *
 * <p>Thread-safety: records live in a concurrent map; who returns a record is decided by an
 * atomic {@code remove(id, record)}, so an explicit release and a session ending concurrently
 * return a block exactly once.
 */
public final class LeaseBook {
  /**
   * The session registry's logger, by name: operators filter the sessions' and leases' story by
   * one name, whichever package writes a line of it.
   */
  private static final Logger log = LoggerFactory.getLogger("io.gpumemd.server.session.SessionRegistry");

  private final DevicePools pools;
  private final MemoryBackend backend;
  private final Ticker ticker;
  private final ConcurrentHashMap<String, LeaseRecord> records = new ConcurrentHashMap<>();
  private final AtomicLong sequence = new AtomicLong();
  /** Written by the reaper thread only. */
  private long lastLeakScanNanos = Long.MIN_VALUE / 2;

  public LeaseBook(DevicePools pools, MemoryBackend backend, Ticker ticker) {
    this.pools = pools;
    this.backend = backend;
    this.ticker = ticker;
  }

  /**
   * Records a block the pool leased for the reservation's session, committing the reservation.
   *
   * @throws NotFoundException when the session ended meanwhile (the block is given back)
   */
  public LeaseRecord record(Reservation reservation, LeasedBlock leased, long size, String tag) {
    LeaseHolder session = reservation.session();
    LeaseRecord lease = new LeaseRecord(SecureIds.next(), session, leased, size, tag, ticker.nanos(),
        sequence.incrementAndGet());
    enter(reservation, lease);
    return lease;
  }

  /**
   * Gives the reservation's session its own hold on a shared block, committing the reservation.
   * The session becomes a mapper of the block's segment before it learns the handle.
   *
   * @throws NotFoundException when the session ended or the block went back meanwhile
   */
  public LeaseRecord hold(Reservation reservation, SharedBlock shared, boolean readOnly, String tag) {
    LeaseHolder session = reservation.session();
    LeaseRecord hold = new LeaseRecord(SecureIds.next(), session, shared, readOnly, tag, ticker.nanos(),
        sequence.incrementAndGet());
    if (!shared.addRecord(hold)) {
      throw new NotFoundException("the shared block was released by all its holders");
    }
    // Cannot fail: the block stays leased while it has a hold, and ours is one.
    pools.get(shared.block().device()).attached(shared.block(), session.id());
    enter(reservation, hold);
    log.atDebug().addKeyValue("session", session.id()).addKeyValue("lease", hold.id())
        .log("{}: hold {} on block of segment {} offset {} ({} holds{})", session, hold.id(),
        shared.block().segmentId(), shared.block().offset(), shared.holds(), readOnly ? ", read-only" : "");
    return hold;
  }

  private void enter(Reservation reservation, LeaseRecord record) {
    records.put(record.id(), record);
    if (!reservation.commit(record)) {
      if (records.remove(record.id(), record)) {
        returnBlock(record, null);
      }
      // The session ended while the record was being made, after its end() told the pools it
      // maps nothing; the record re-registered it as a mapper of the segment. Tell the pool
      // again, or an eviction of that segment would wait forever for an unmap.
      pools.get(record.block().device()).holderEnded(record.session().id());
      throw Reservation.ended(record.session());
    }
  }

  /**
   * A live lease or hold of the session by id.
   *
   * @throws NotFoundException for an unknown id or another session's, the same answer for both
   */
  public LeaseRecord find(LeaseHolder session, String leaseId) {
    SecureIds.check("lease_id", leaseId);
    return lookup(session, leaseId);
  }

  /** {@link #find} of an id already checked well-formed. */
  private LeaseRecord lookup(LeaseHolder session, String leaseId) {
    LeaseRecord lease = records.get(leaseId);
    if (lease == null || lease.session() != session) {
      throw new NotFoundException("lease " + leaseId + " not found in this session (unknown, already released, "
          + "or held by another session)");
    }
    return lease;
  }

  /** A live lease of the session by id, or null (also for a malformed id). */
  public LeaseRecord own(LeaseHolder session, String leaseId) {
    if (!SecureIds.isWellFormed(leaseId)) {
      return null;
    }
    LeaseRecord lease = records.get(leaseId);
    return lease != null && lease.session() == session ? lease : null;
  }

  /**
   * Releases a lease or hold of a session; with a completion event the block is reused once it
   * fires. A distrusted client that now keeps nothing cached gets its allowance back.
   *
   * @throws NotFoundException for an unknown lease, another session's lease, or a repeat
   */
  public void release(LeaseHolder session, String leaseId, byte[] eventHandle) {
    SecureIds.check("lease_id", leaseId);
    Validation.eventHandle(eventHandle);
    LeaseRecord lease = lookup(session, leaseId);
    CompletionEvent event = eventHandle.length == 0 ? null : backend.openEvent(lease.block().device(), eventHandle);
    if (!records.remove(leaseId, lease)) {
      if (event != null) {
        event.close();
      }
      throw new NotFoundException("lease " + leaseId + " was already released");
    }
    session.forget(lease);
    returnBlock(lease, event);
    long restored = session.restoreTrustIfReturned();
    if (restored >= 0) {
      log.info("{} gave back its client-cached blocks: client cache allowance {} restored", session,
          Sizes.format(restored));
      session.cacheAllowanceRestored(restored);
    }
  }

  /** Returns the records of an ended session. Returns {leases, bytes, holds} it returned. */
  public long[] returnAll(Collection<LeaseRecord> ended) {
    long[] returned = new long[3];
    for (LeaseRecord lease : ended) {
      if (records.remove(lease.id(), lease)) {
        if (lease.attached()) {
          returned[2]++;
        } else {
          returned[0]++;
          returned[1] += lease.block().size();
        }
        returnBlock(lease, null);
      }
    }
    return returned;
  }

  /**
   * Gives a record's block back to its pool and its bytes back to the tenant's quota; for a
   * shared block, drops the record's hold and gives the block back only with the last one. A
   * hold's place among its tenant's holds comes back here, whatever ended it (Release, the
   * session ending, an attach undone).
   */
  private void returnBlock(LeaseRecord lease, CompletionEvent event) {
    Block block = lease.block();
    SharedBlock shared = lease.markReleased();
    // Released now, the record can neither fall asleep nor wake any more.
    LeaseRecord.Asleep asleep = lease.asleep();
    if (lease.attached()) {
      pools.get(block.device()).holdReleased();
      lease.session().tenantUsage().unreserveHold();
    }
    if (asleep != null) {
      // Its block is the pool's already (or its sleep frees it next): drop its contents. A shared
      // one's tokens and names, if any are left, hold nothing from now on (orphaned).
      if (shared != null && !shared.dropRecord(lease, null)) {
        shared.orphan();
      }
      asleep.drop();
      if (event != null) {
        event.close();
      }
      lease.session().tenantUsage().unreserve(SizeClasses.roundUp(lease.sizeBytes()));
    } else if (shared == null) {
      pools.get(block.device()).release(block, event);
      lease.session().tenantUsage().unreserve(SizeClasses.roundUp(lease.sizeBytes()));
    } else if (shared.dropRecord(lease, event)) {
      giveBack(shared);
    }
    if (lease.leakReported) {
      log.atInfo().addKeyValue("lease", lease.id()).addKeyValue("session", lease.session().id())
          .log("Lease {} of {} returned after {} ms (previously reported as possibly leaked)",
          lease.id(), lease.session(), (ticker.nanos() - lease.grantedNanos()) / 1_000_000);
    }
  }

  /** The last hold on a shared block is gone: the block goes back, the tenant's quota too. */
  public void giveBack(SharedBlock shared) {
    Block block = shared.block();
    if (shared.orphaned()) {
      // Its lease was released asleep: the block went to the pool and the quota came back then.
      log.atDebug().log("Shared block of segment {} offset {} returned: its last hold is gone (its lease was "
          + "released while asleep)", block.segmentId(), block.offset());
      return;
    }
    DevicePool pool = pools.get(block.device());
    pool.sharedBlockReturned();
    pool.release(block, shared.takeEvents());
    shared.leasedBy().unreserve(SizeClasses.roundUp(shared.sizeBytes()));
    log.atDebug().log("Shared block of segment {} offset {} returned: its last hold is gone", block.segmentId(),
        block.offset());
  }

  /** The last sequence number given out (snapshot). */
  public long sequence() {
    return sequence.get();
  }

  /**
   * Enters the records of a snapshot into an empty book, and continues the
   * sequence after {@code lastSequence} (restore). Their sessions already count them
   * ({@link LeaseHolder#restoreRecord}); their blocks are the pool's already.
   *
   * @throws IllegalStateException when the book is not empty
   */
  public void restore(Collection<LeaseRecord> restored, long lastSequence) {
    if (!records.isEmpty() || sequence.get() != 0) {
      throw new IllegalStateException("lease book already in use: " + records.size() + " records");
    }
    for (LeaseRecord r : restored) {
      records.put(r.id(), r);
    }
    sequence.set(lastSequence);
  }

  // ------------------------------------------------------------------------------ reaper, listing

  /**
   * Reports leases held past {@code leakNanos} (0 = off), each once, at WARN; scans every lease,
   * O(leases), so a few times per threshold and not on every call. Reaper thread only.
   */
  public void reportLeaks(long nowNanos, long leakNanos) {
    long scanEvery = Math.max(TimeUnit.MILLISECONDS.toNanos(100), Math.min(leakNanos / 10, TimeUnit.SECONDS.toNanos(5)));
    if (leakNanos <= 0 || nowNanos - lastLeakScanNanos < scanEvery) {
      return;
    }
    lastLeakScanNanos = nowNanos;
    for (LeaseRecord lease : records.values()) {
      if (!lease.leakReported && nowNanos - lease.grantedNanos() > leakNanos) {
        lease.leakReported = true;
        log.atWarn().addKeyValue("lease", lease.id()).addKeyValue("session", lease.session().id())
            .addKeyValue("client", lease.session().clientName()).addKeyValue("device", lease.block().device())
            .addKeyValue("size_bytes", lease.sizeBytes()).addKeyValue("tag", lease.tag())
            .log("Possible leak: lease {} held for {} ms by session {} ('{}'): device {}, {} bytes, tag '{}'",
            lease.id(), (nowNanos - lease.grantedNanos()) / 1_000_000, lease.session().id(),
            lease.session().clientName(), lease.block().device(), lease.sizeBytes(), lease.tag());
      }
    }
  }

  /** Leases in grant order, the order of {@link #page}. */
  public static final Comparator<LeaseRecord> LEASE_ORDER = Comparator.comparingLong(LeaseRecord::sequence);

  /** Live leases in grant order: every tenant's for an admin, else the caller's tenant's only. */
  public List<LeaseRecord> list(Caller caller, Integer device, String sessionId) {
    List<LeaseRecord> out = new ArrayList<>(records.values().stream().filter(visible(caller, device, sessionId))
        .toList());
    out.sort(LEASE_ORDER);
    return out;
  }

  /**
   * A page of live leases in grant order, after the lease with sequence number
   * {@code afterSequence} (0 for the first page): every tenant's for an admin, else the caller's
   * tenant's only.
   */
  public Page<LeaseRecord> page(Caller caller, Integer device, String sessionId, long afterSequence, int size) {
    return Page.select(records.values(), visible(caller, device, sessionId),
        lease -> lease.sequence() > afterSequence, LEASE_ORDER, size);
  }

  /** The leases a listing shows the caller, on a device and of a session if named (checked here). */
  private Predicate<LeaseRecord> visible(Caller caller, Integer device, String sessionId) {
    if (!sessionId.isEmpty()) {
      SecureIds.check("session_id", sessionId);
    }
    if (device != null) {
      pools.get(device);
    }
    return lease -> (device == null || lease.block().device() == device)
        && (sessionId.isEmpty() || lease.session().id().equals(sessionId))
        && (caller.admin() || caller.owns(lease.session().tenant()));
  }

  /** Every live record, in no order. */
  public Collection<LeaseRecord> all() {
    return records.values();
  }

  public int size() {
    return records.size();
  }
}
