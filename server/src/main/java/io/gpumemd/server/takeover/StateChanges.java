package io.gpumemd.server.takeover;

import io.gpumemd.proto.takeover.v1.PoolState;
import io.gpumemd.proto.takeover.v1.SessionsState;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.server.pool.PoolSnapshot;
import io.gpumemd.server.pool.PoolSnapshot.SegmentSnapshot;
import io.gpumemd.server.session.SessionsSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.LeaseSnapshot;
import io.gpumemd.server.takeover.TakeOverState.Books;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * What changed in the books between two writings of them ({@link #between}), and the way back
 * ({@link #apply}): the earlier books with the changes applied equal the later ones, record for
 * record. What lets the running daemon send its books ahead while it serves, and only what
 * changed since inside the pause: with 10,000 live leases a pause that writes, sends, reads and
 * converts them all took tens of milliseconds more than one that carries a worker's few changes.
 *
 * <p>The leases and the segments are what grows with a node; they are carried as changes. Leases
 * by id: those changed or new, and the ids of those gone, an unchanged one's age growing by the
 * time between the writings. Segments by id, per pool: every id in order, and only the segments
 * changed or new. Everything else (sessions, shared blocks, tokens, names, the churn window, the
 * pools' figures) is small and carried whole. A segment or lease that differs in any field (its
 * descriptor index, its shared block's index) counts as changed, so nothing is carried over
 * that the later writing does not hold.
 *
 * <p>Stateless.
 */
final class StateChanges {
  /**
   * The later books, as changes to the earlier ones.
   *
   * @param pools each pool as written later, with only the segments changed or new
   * @param segmentIds each pool's segment ids as written later, in order
   * @param sessions the session layer as written later, with only the leases changed or new
   * @param removedLeaseIds the earlier books' leases that are gone
   * @param elapsedNanos from the earlier writing to the later: what an unchanged lease aged
   */
  record Changes(List<PoolSnapshot> pools, List<List<Long>> segmentIds, SessionsSnapshot sessions,
      List<String> removedLeaseIds, long elapsedNanos) {
    Changes {
      pools = List.copyOf(pools);
      segmentIds = List.copyOf(segmentIds);
      removedLeaseIds = List.copyOf(removedLeaseIds);
    }
  }

  private StateChanges() {}

  /** What changed from {@code before} to {@code after}, both written by this daemon ({@link TakeOverState#write}). */
  static Changes between(Books before, Books after) {
    long elapsed = after.writtenAtNanos() - before.writtenAtNanos();
    if (before.pools().size() != after.pools().size()) {
      throw new IllegalStateException("the pools changed in number between two writings: " + before.pools().size()
          + ", then " + after.pools().size());
    }
    List<PoolSnapshot> pools = new ArrayList<>();
    List<List<Long>> segmentIds = new ArrayList<>();
    for (int i = 0; i < after.pools().size(); i++) {
      Map<Long, SegmentSnapshot> was = byId(before.pools().get(i).segments());
      List<SegmentSnapshot> changed = new ArrayList<>();
      List<Long> ids = new ArrayList<>();
      for (SegmentSnapshot s : after.pools().get(i).segments()) {
        ids.add(s.id());
        if (!s.equals(was.get(s.id()))) {
          changed.add(s);
        }
      }
      pools.add(after.pools().get(i).withSegments(changed));
      segmentIds.add(ids);
    }
    List<LeaseSnapshot> changed = new ArrayList<>();
    List<String> gone = new ArrayList<>();
    leaseChanges(before.sessions().leases(), after.sessions().leases(), elapsed, changed, gone);
    return new Changes(pools, segmentIds, after.sessions().withLeases(changed), gone, elapsed);
  }

  /**
   * The leases changed or new from {@code before} to {@code after} (into {@code changed}), and the
   * ids of those gone (into {@code gone}): both lists in grant order, as a writing puts them, are
   * walked side by side, with no map of 10,000 leases built inside the pause.
   *
   * @throws IllegalStateException when either list is not in strict grant order (the walk would
   *     miss changes): the caller refuses the hand-over
   */
  private static void leaseChanges(List<LeaseSnapshot> before, List<LeaseSnapshot> after, long elapsed,
      List<LeaseSnapshot> changed, List<String> gone) {
    int i = 0;
    int j = 0;
    long lastBefore = Long.MIN_VALUE;
    long lastAfter = Long.MIN_VALUE;
    while (i < before.size() || j < after.size()) {
      LeaseSnapshot was = i < before.size() ? before.get(i) : null;
      LeaseSnapshot now = j < after.size() ? after.get(j) : null;
      if (now == null || was != null && was.sequence() < now.sequence()) {
        lastBefore = inOrder(lastBefore, was);
        gone.add(was.id());
        i++;
      } else if (was == null || now.sequence() < was.sequence()) {
        lastAfter = inOrder(lastAfter, now);
        changed.add(now);
        j++;
      } else {
        lastBefore = inOrder(lastBefore, was);
        lastAfter = inOrder(lastAfter, now);
        if (!was.id().equals(now.id())) {
          gone.add(was.id());
          changed.add(now);
        } else if (!was.olderBy(elapsed).equals(now)) {
          changed.add(now);
        }
        i++;
        j++;
      }
    }
  }

  private static long inOrder(long last, LeaseSnapshot next) {
    if (next.sequence() <= last) {
      throw new IllegalStateException("the leases are not written in grant order: " + next.id() + " (sequence "
          + next.sequence() + ") after sequence " + last);
    }
    return next.sequence();
  }

  /**
   * The books {@code changes} were taken to: {@code before} (the books sent ahead) with them
   * applied.
   *
   * @throws IllegalStateException when the changes do not fit {@code before} (naming what): a
   *     segment or lease they keep or remove that it does not hold, another number of pools
   */
  static Books apply(Books before, Changes changes) {
    if (before.pools().size() != changes.pools().size()) {
      throw new IllegalStateException("the changes name " + changes.pools().size() + " pool(s), the books sent ahead "
          + before.pools().size());
    }
    List<PoolSnapshot> pools = new ArrayList<>();
    for (int i = 0; i < changes.pools().size(); i++) {
      pools.add(applyToPool(before.pools().get(i), changes.pools().get(i), changes.segmentIds().get(i)));
    }
    return new Books(pools, applyToSessions(before.sessions(), changes), 0);
  }

  private static PoolSnapshot applyToPool(PoolSnapshot before, PoolSnapshot changed, List<Long> ids) {
    if (before.device() != changed.device()) {
      throw new IllegalStateException("the changes' pool of device " + changed.device() + " is device "
          + before.device() + "'s in the books sent ahead");
    }
    Map<Long, SegmentSnapshot> was = byId(before.segments());
    Map<Long, SegmentSnapshot> now = byId(changed.segments());
    List<SegmentSnapshot> segments = new ArrayList<>(ids.size());
    Set<Long> listed = new HashSet<>();
    for (long id : ids) {
      SegmentSnapshot s = now.containsKey(id) ? now.get(id) : was.get(id);
      if (s == null || !listed.add(id)) {
        throw new IllegalStateException("device " + changed.device() + ": segment " + id + (s == null
            ? " is neither in the books sent ahead nor among the changes" : " is listed twice in the changes"));
      }
      segments.add(s);
    }
    if (!listed.containsAll(now.keySet())) {
      throw new IllegalStateException("device " + changed.device() + ": the changes carry a segment they do not list");
    }
    return changed.withSegments(segments);
  }

  private static SessionsSnapshot applyToSessions(SessionsSnapshot before, Changes changes) {
    Set<String> removed = new HashSet<>(changes.removedLeaseIds());
    List<LeaseSnapshot> changed = changes.sessions().leases();
    Set<String> replaced = new HashSet<>();
    changed.forEach(l -> replaced.add(l.id()));
    // Both in grant order: merged side by side, the result in grant order too (LeaseBook.LEASE_ORDER).
    List<LeaseSnapshot> leases = new ArrayList<>(before.leases().size() + changed.size());
    int next = 0;
    for (LeaseSnapshot l : before.leases()) {
      if (removed.remove(l.id()) || replaced.contains(l.id())) {
        continue;
      }
      while (next < changed.size() && changed.get(next).sequence() < l.sequence()) {
        leases.add(changed.get(next++));
      }
      leases.add(l.olderBy(changes.elapsedNanos()));
    }
    leases.addAll(changed.subList(next, changed.size()));
    if (!removed.isEmpty()) {
      throw new IllegalStateException("lease " + removed.iterator().next() + " is gone in the changes but not in the "
          + "books sent ahead");
    }
    return changes.sessions().withLeases(leases);
  }

  private static Map<Long, SegmentSnapshot> byId(List<SegmentSnapshot> segments) {
    Map<Long, SegmentSnapshot> out = new HashMap<>();
    segments.forEach(s -> out.put(s.id(), s));
    return out;
  }

  /** {@code changes} on the wire: a State with changes_only. */
  static State.Builder toProto(Changes changes) {
    State.Builder state = State.newBuilder().setChangesOnly(true).setAheadElapsedNanos(changes.elapsedNanos());
    for (int i = 0; i < changes.pools().size(); i++) {
      state.addPools(PoolStates.toProto(changes.pools().get(i)).toBuilder().addAllSegmentIds(changes.segmentIds().get(i)));
    }
    return state.setSessions(SessionsStates.toProto(changes.sessions()).toBuilder()
        .addAllRemovedLeaseIds(changes.removedLeaseIds()));
  }

  /** The changes a State with changes_only carries. */
  static Changes fromProto(State state) {
    List<PoolSnapshot> pools = new ArrayList<>();
    List<List<Long>> ids = new ArrayList<>();
    for (PoolState p : state.getPoolsList()) {
      pools.add(PoolStates.fromProto(p));
      ids.add(p.getSegmentIdsList());
    }
    SessionsState sessions = state.getSessions();
    return new Changes(pools, ids, SessionsStates.fromProto(sessions), sessions.getRemovedLeaseIdsList(),
        state.getAheadElapsedNanos());
  }
}
