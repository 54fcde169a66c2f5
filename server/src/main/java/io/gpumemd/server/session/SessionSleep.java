package io.gpumemd.server.session;

import io.gpumemd.common.Sizes;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Reservation;
import io.gpumemd.server.books.Validation;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.offload.HostStore;
import io.gpumemd.server.offload.ParkedRange;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Sleep and wake of a session (Allocator.Sleep and Wake; the design is in {@code
 * offload/package-info.java}): which leases sleep, the refusals that change nothing, parking
 * their contents in the {@link HostStore}, freeing their device memory, and on wake new memory
 * with each lease at its old offset and its old bytes.
 *
 * <p>It owns no state: a sleeping lease is a {@link LeaseRecord} with {@link LeaseRecord.Asleep}
 * (its contents) and a detached block (where it was); the session says whether it sleeps ({@link
 * io.gpumemd.server.books.LeaseHolder#beginSleepChange}).
 *
 * <p>A lease whose block is shared (share tokens, published names, other sessions' holds)
 * sleeps once the other sessions have released their holds: the sleep waits for them up to
 * {@code --unmap-wait-ms}, and is refused naming those left ({@link SharedSleep}). Its tokens and
 * names stay while it sleeps, refusing Attach and Lookup with FAILED_PRECONDITION naming the
 * sleep, and refer to its new block once it wakes ({@link
 * io.gpumemd.server.books.SharedBlock#wake}).
 *
 * <p>Thread-safe: one Sleep or Wake per session at a time (a second is refused), any number of
 * sessions at once. A Release of a lease racing its sleep or wake is ordered by the record
 * ({@link LeaseRecord#fallAsleep}, {@link LeaseRecord#wake}), and for a shared block by the
 * block's monitor too.
 */
public final class SessionSleep {
  private static final Logger log = LoggerFactory.getLogger(SessionSleep.class);

  private final SessionRegistry registry;
  private final LeaseBook book;
  private final DevicePools pools;
  private final HostStore store;
  private final SleepAsks asks;

  /**
   * What a sleep did.
   *
   * @param leaseIds the leases that went to sleep
   * @param segmentIds the segments they were in
   * @param hostBytes bytes the session now keeps in host memory, all its sleeps together
   * @param freedBytes device bytes this sleep gave back to the pool
   */
  public record Slept(List<String> leaseIds, List<Long> segmentIds, long hostBytes, long freedBytes) {}

  /**
   * One slept segment woken.
   *
   * @param oldSegmentId where the leases were
   * @param leases the woken leases, now in one new segment, each at its old offset
   */
  public record Woken(long oldSegmentId, List<LeaseRecord> leases) {}

  SessionSleep(SessionRegistry registry, LeaseBook book, HostStore store, SleepAsks asks) {
    this.registry = registry;
    this.book = book;
    this.pools = registry.pools();
    this.store = store;
    this.asks = asks;
  }

  /** An admin's sleep and wake of sessions, asked of their clients. */
  public SleepAsks asks() {
    return asks;
  }

  /** The bound and figures of parked contents. */
  public HostStore store() {
    return store;
  }

  // ------------------------------------------------------------------------------ sleep

  /**
   * Puts leases of a session of the caller's tenant to sleep (see Allocator.Sleep); a refusal
   * changes nothing.
   *
   * @param tags only the segments holding a lease with one of these tags; empty: every lease
   * @param vacated the segments the client vacated: must cover every segment that sleeps
   */
  public Slept sleep(Caller caller, String sessionId, int level, List<String> tags, Collection<Long> vacated) {
    if (level != 1 && level != 2) {
      throw new InvalidRequestException("level: " + level + " (expected: 1 to keep the contents in host memory, "
          + "2 to drop them)");
    }
    for (String tag : tags) {
      Validation.label("tags", tag);
    }
    Session session = registry.session(caller, sessionId);
    List<LeaseRecord> records = begin(session);
    Slept slept = null;
    try {
      slept = sleep(session, records, level, Set.copyOf(tags), Set.copyOf(vacated));
      return slept;
    } finally {
      session.endSleepChange(anyAsleep(records) || slept != null && !slept.leaseIds().isEmpty());
    }
  }

  private Slept sleep(Session session, List<LeaseRecord> records, int level, Set<String> tags, Set<Long> vacated) {
    long start = System.nanoTime();
    Set<Long> segments = new TreeSet<>();
    for (LeaseRecord r : records) {
      // A client-cached lease names no segment: the client gives its tier back before it calls,
      // and the release may still be on its way.
      if (r.asleep() == null && !r.attached() && !session.keepsCached(r)
          && (tags.isEmpty() || tags.contains(r.tag()))) {
        segments.add(r.block().segmentId());
      }
    }
    List<LeaseRecord> sleepers = new ArrayList<>();
    List<LeaseRecord> cached = new ArrayList<>();
    for (LeaseRecord r : records) {
      if (r.asleep() == null && segments.contains(r.block().segmentId())) {
        checkCanSleep(session, r);
        (session.keepsCached(r) ? cached : sleepers).add(r);
      }
    }
    Set<Long> missing = new TreeSet<>(segments);
    missing.removeAll(vacated);
    if (!missing.isEmpty()) {
      throw new InvalidRequestException("vacated_segment_ids: segments " + missing + " hold leases that would sleep "
          + "and were not vacated (the client unmaps them, keeping their address ranges, before it calls Sleep)");
    }
    // Shared blocks wait for their other holders; until the sleep has freed them, a refusal
    // opens them again.
    SharedSleep shared = SharedSleep.closeAndAwait(session, sleepers, pools);
    long freed;
    List<String> ids = new ArrayList<>(sleepers.size());
    long parkedAt;
    long copyStart;
    try {
      copyStart = System.nanoTime();
      List<ParkedRange> parked = park(session, sleepers, level, tags); // the last refusal: nothing changed before
      parkedAt = System.nanoTime();
      // Nothing of the session is client-cached in a segment it vacated: the client gave its
      // tier back before it called (notices cross calls), and what is left goes back now, before
      // the blocks are freed, so that the segments it was in are left unused.
      for (LeaseRecord r : cached) {
        releaseQuietly(session, r);
      }
      freed = free(session, sleepers, parked, shared, ids);
    } catch (RuntimeException e) {
      shared.reopen();
      throw e;
    }
    long hostBytes = session.sleepFigures()[1];
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("leases", ids.size())
        .log("{} sleeps at level {}: {} leases in {} segments{}{}; {} of device memory freed, {} kept in host "
            + "memory in all; {} ms (copies {} ms)", session, level, ids.size(), segments.size(),
            tags.isEmpty() ? "" : " (tags " + tags + ")", shared.waited(), Sizes.format(freed),
            Sizes.format(hostBytes), (System.nanoTime() - start) / 1_000_000, (parkedAt - copyStart) / 1_000_000);
    return new Slept(ids, List.copyOf(segments), hostBytes, freed);
  }

  /**
   * Puts each sleeper to sleep with its parked contents and frees its block.
   *
   * @param ids filled with the leases that went to sleep
   * @return device bytes freed
   */
  private long free(Session session, List<LeaseRecord> sleepers, List<ParkedRange> parked, SharedSleep shared,
      List<String> ids) {
    Map<DevicePool, List<LeaseRecord>> byPool = new LinkedHashMap<>();
    for (int i = 0; i < sleepers.size(); i++) {
      LeaseRecord r = sleepers.get(i);
      int leaseLevel = parked.get(i) == null ? 2 : 1;
      if (r.fallAsleep(new LeaseRecord.Asleep(leaseLevel, parked.get(i)))) {
        shared.fellAsleep(r, pools);
        byPool.computeIfAbsent(pools.get(r.block().device()), p -> new ArrayList<>()).add(r);
        ids.add(r.id());
      } else {
        shared.notAsleep(r);
        if (parked.get(i) != null) {
          parked.get(i).drop(); // released meanwhile: its release gave the block back
        }
      }
    }
    long freed = 0;
    for (Map.Entry<DevicePool, List<LeaseRecord>> e : byPool.entrySet()) {
      List<Block> blocks = new ArrayList<>();
      e.getValue().forEach(r -> blocks.add(r.block()));
      Set<Long> ofPool = new HashSet<>();
      blocks.forEach(b -> ofPool.add(b.segmentId()));
      List<Block> places = e.getKey().sleep().sleep(blocks, session.id(), ofPool);
      for (int i = 0; i < places.size(); i++) {
        e.getValue().get(i).moved(places.get(i));
        shared.freed(e.getValue().get(i), places.get(i));
        freed += places.get(i).size();
      }
    }
    return freed;
  }

  /** Refuses a lease that cannot sleep, naming why; changes nothing. */
  private static void checkCanSleep(Session session, LeaseRecord r) {
    if (r.attached()) {
      throw new ConflictException("lease " + r.id() + " of " + session + " is a hold on another lease's block "
          + "(Attach or Lookup) in a segment that would sleep: a block others use cannot be freed; release the hold "
          + "first, or sleep with tags that leave its segment awake");
    }
    if (r.block().memory().handle() instanceof IpcHandle.CudaIpc) {
      throw new ConflictException(session + " maps its leases through CUDA IPC handles, which a client cannot "
          + "place at a reserved address: sleep needs the daemon started with --cuda-handles vmm");
    }
  }

  /**
   * Copies out the contents that are kept (every lease at level 1; at level 2, those without one
   * of the tags), all or nothing.
   *
   * @return per sleeper, its parked contents, or null when dropped
   * @throws io.gpumemd.server.error.ExhaustedException when they would exceed the store's bound
   */
  private List<ParkedRange> park(Session session, List<LeaseRecord> sleepers, int level, Set<String> tags) {
    long bytes = 0;
    for (LeaseRecord r : sleepers) {
      if (keeps(r, level, tags)) {
        bytes += r.block().size();
      }
    }
    List<ParkedRange> parked = new ArrayList<>(sleepers.size());
    try (HostStore.Claim claim = store.claim(bytes, "the sleeping leases of " + session)) {
      for (LeaseRecord r : sleepers) {
        Block b = r.block();
        parked.add(keeps(r, level, tags) ? claim.park(b.memory(), b.offset(), b.size()) : null);
      }
      return parked;
    } catch (RuntimeException e) {
      parked.forEach(p -> {
        if (p != null) {
          p.drop();
        }
      });
      throw e;
    }
  }

  /** A lease without one of the tags keeps its contents whatever the level: the sleep did not name it. */
  private static boolean keeps(LeaseRecord r, int level, Set<String> tags) {
    return level == 1 || !tags.isEmpty() && !tags.contains(r.tag());
  }

  private void releaseQuietly(Session session, LeaseRecord r) {
    try {
      book.release(session, r.id(), new byte[0]);
    } catch (NotFoundException e) {
      // released meanwhile: nothing left to give back
    }
  }

  // ------------------------------------------------------------------------------ wake

  /**
   * Wakes every sleeping lease of a session of the caller's tenant (see Allocator.Wake); all or
   * nothing: when the memory cannot be had, the session stays asleep.
   *
   * @return the slept segments, in the order they slept, with their leases now in new ones
   * @throws io.gpumemd.server.error.ExhaustedException when the memory cannot be had
   */
  public List<Woken> wake(Caller caller, String sessionId) {
    Session session = registry.session(caller, sessionId);
    List<LeaseRecord> records = begin(session);
    boolean asleep = true;
    try {
      List<Woken> woken = wake(session, records);
      asleep = false;
      return woken;
    } finally {
      session.endSleepChange(asleep && anyAsleep(records));
    }
  }

  private List<Woken> wake(Session session, List<LeaseRecord> records) {
    long start = System.nanoTime();
    long allocated = start;
    Map<Long, List<LeaseRecord>> bySegment = new LinkedHashMap<>();
    records.stream().filter(r -> r.asleep() != null).sorted(Comparator.comparingLong(LeaseRecord::sequence))
        .forEach(r -> bySegment.computeIfAbsent(r.block().segmentId(), id -> new ArrayList<>()).add(r));
    Map<LeaseRecord, Block> fresh = new LinkedHashMap<>();
    try {
      for (List<LeaseRecord> leases : bySegment.values()) {
        leases.sort(Comparator.comparingLong(r -> r.block().offset()));
        Block place = leases.get(0).block();
        long[] ranges = new long[2 * leases.size()];
        for (int i = 0; i < leases.size(); i++) {
          ranges[2 * i] = leases.get(i).block().offset();
          ranges[2 * i + 1] = leases.get(i).block().size();
        }
        List<Block> blocks = pools.get(place.device()).sleep().wake(place.segmentBytes(), place.smallSegment(), ranges,
            session.id(), session.segmentOwner());
        for (int i = 0; i < leases.size(); i++) {
          fresh.put(leases.get(i), blocks.get(i));
        }
      }
      allocated = System.nanoTime();
      fresh.forEach((r, b) -> {
        ParkedRange parked = r.asleep().parked();
        try {
          if (parked != null) {
            parked.restoreInto(b.memory(), b.offset());
          }
        } catch (IllegalStateException dropped) {
          // Released meanwhile, its contents dropped: its new block goes back below.
        }
      });
    } catch (RuntimeException e) {
      fresh.values().forEach(b -> pools.get(b.device()).release(b, null));
      throw e;
    }
    long restored = 0;
    for (Map.Entry<LeaseRecord, Block> e : fresh.entrySet()) {
      LeaseRecord r = e.getKey();
      // A shared block wakes with its lease: its tokens and names refer to the new block.
      LeaseRecord.Asleep was = r.shared() == null ? r.wake(e.getValue())
          : r.shared().wake(r, e.getValue(), pools.get(e.getValue().device()));
      if (was == null) {
        pools.get(e.getValue().device()).release(e.getValue(), null); // released while waking
      } else {
        restored += was.hostBytes();
        was.drop();
      }
    }
    List<Woken> woken = new ArrayList<>(bySegment.size());
    bySegment.forEach((id, leases) -> woken.add(new Woken(id, leases)));
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("leases", fresh.size())
        .log("{} woke: {} leases in {} segments, {} restored from host memory; {} ms (new memory {} ms)", session,
            fresh.size(), bySegment.size(), Sizes.format(restored), (System.nanoTime() - start) / 1_000_000,
            (allocated - start) / 1_000_000);
    return woken;
  }

  // ------------------------------------------------------------------------------ common

  private static List<LeaseRecord> begin(Session session) {
    try {
      return session.beginSleepChange();
    } catch (IllegalStateException e) {
      throw Reservation.ended(session);
    }
  }

  private static boolean anyAsleep(List<LeaseRecord> records) {
    for (LeaseRecord r : records) {
      if (r.asleep() != null) {
        return true;
      }
    }
    return false;
  }
}
