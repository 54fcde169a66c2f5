package io.gpumemd.server.session;

import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.server.sharing.PublishedObject;
import io.gpumemd.server.sharing.ShareToken;
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.session.SessionsSnapshot.ClientCounters;
import io.gpumemd.server.session.SessionsSnapshot.LeaseSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.ObjectSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.SessionSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.SharedBlockSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.TokenSnapshot;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * Writes the registry's rooms down as a {@link SessionsSnapshot} ({@link #take}), for {@link
 * SessionsRestorer} to rebuild them in another process: sessions, records, shared blocks,
 * tokens, names, the lease sequence and the churn window, in a stable order (sessions, leases,
 * tokens and names sorted; shared blocks in the order first named), instants as ages from now.
 *
 * <p>Thread-safety: runs while no request is applied (the caller's gate) but still reads each
 * object under the monitor that guards it. One call at a time.
 */
final class SessionsSnapshotWriter {
  private final LiveSessions sessions;
  private final LeaseBook book;
  private final SharedObjects sharing;
  private final SessionChurn churn;

  SessionsSnapshotWriter(LiveSessions sessions, LeaseBook book, SharedObjects sharing, SessionChurn churn) {
    this.sessions = sessions;
    this.book = book;
    this.sharing = sharing;
    this.churn = churn;
  }

  /**
   * The registry written down, instants as ages from {@code now} (the registry's clock).
   *
   * @throws IllegalStateException when the books disagree (a record its session does not hold),
   *     or a shared block still waits for a released holder's completion event, which cannot
   *     move to another process (the caller refuses and may retry)
   */
  SessionsSnapshot take(long now) {
    List<Session> live = new ArrayList<>(sessions.all());
    live.sort(Session.ORDER);
    Map<String, Boolean> clientCached = new HashMap<>();
    Map<Session, Session.Exported> exported = new IdentityHashMap<>();
    List<SessionSnapshot> sessionSnapshots = new ArrayList<>();
    for (Session s : live) {
      Session.Exported e = s.exportState();
      exported.put(s, e);
      clientCached.putAll(e.books().clientCached());
      sessionSnapshots.add(session(s, e, now));
    }

    Map<SharedBlock, Integer> index = new IdentityHashMap<>();
    List<SharedBlock> blocks = new ArrayList<>();
    List<LeaseRecord> records = new ArrayList<>(book.all());
    records.sort(LeaseBook.LEASE_ORDER);
    List<LeaseSnapshot> leases = new ArrayList<>();
    for (LeaseRecord r : records) {
      Boolean cached = clientCached.get(r.id());
      if (cached == null || exported.get(r.session()) == null) {
        throw new IllegalStateException("lease " + r.id() + " of " + r.session()
            + " is in the lease book but not among its live session's leases");
      }
      leases.add(lease(r, cached, indexOf(r.shared(), index, blocks), now));
    }

    List<ShareToken> tokens = new ArrayList<>(sharing.allTokens());
    tokens.sort(SharedObjects.TOKEN_ORDER);
    List<TokenSnapshot> tokenSnapshots = new ArrayList<>();
    for (ShareToken t : tokens) {
      tokenSnapshots.add(token(t, indexOf(t.shared(), index, blocks), now));
    }
    List<PublishedObject> objects = new ArrayList<>(sharing.allObjects());
    objects.sort(SharedObjects.OBJECT_ORDER);
    List<ObjectSnapshot> objectSnapshots = new ArrayList<>();
    for (PublishedObject o : objects) {
      objectSnapshots.add(new ObjectSnapshot(o.tenant(), o.name(), indexOf(o.shared(), index, blocks), o.readOnly(),
          now - o.publishedNanos(), o.publishedBy(), o.lookups().get()));
    }
    List<SharedBlockSnapshot> shared = new ArrayList<>();
    for (SharedBlock b : blocks) {
      shared.add(sharedBlock(b));
    }
    long[] c = churn.export();
    SessionsSnapshot.Churn window = new SessionsSnapshot.Churn(now - c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
        c[8], (int) c[9]);
    return new SessionsSnapshot(book.sequence(), sessionSnapshots, leases, shared, tokenSnapshots, objectSnapshots,
        window);
  }

  private static int indexOf(SharedBlock shared, Map<SharedBlock, Integer> index, List<SharedBlock> blocks) {
    if (shared == null) {
      return -1;
    }
    return index.computeIfAbsent(shared, b -> {
      blocks.add(b);
      return blocks.size() - 1;
    });
  }

  private static SessionSnapshot session(Session s, Session.Exported e, long now) {
    Caller c = s.owner();
    SegmentOwner so = s.segmentOwner();
    List<ClientCounters> counters = new ArrayList<>();
    new TreeSet<>(e.books().counters().keySet()).forEach(device -> {
      long[] v = e.books().counters().get(device);
      counters.add(new ClientCounters(device, v[0], v[1]));
    });
    return new SessionSnapshot(s.id(), c, so.key(), so.uid(), so.gid(), s.clientName(), s.ttlSeconds(),
        now - s.openedNanos(), now - e.lastSeenNanos(), e.hadStream(), e.streamAttached(),
        e.hadStream() && !e.streamAttached() ? now - e.detachedNanos() : 0, e.books().grantedCacheBytes(),
        e.books().cacheAllowance(), e.books().cacheReturnOverdue(), counters, e.appliedMessages());
  }

  private static LeaseSnapshot lease(LeaseRecord r, boolean clientCached, int sharedIndex, long now) {
    Block block = r.block();
    return new LeaseSnapshot(r.id(), r.session().id(), block.device(), block.segmentId(), block.offset(),
        block.size(), r.sizeBytes(), r.tag(), now - r.grantedNanos(), r.sequence(), r.poolHit(), r.attached(),
        r.readOnly(), clientCached, r.leakReported(), sharedIndex);
  }

  private static TokenSnapshot token(ShareToken t, int sharedIndex, long now) {
    return new TokenSnapshot(t.secret(), t.id(), t.tenant(), sharedIndex, t.readOnly(), t.maxAttaches(), t.attaches(),
        now - t.createdNanos(), t.expiresNanos() - now, t.sessionId(), t.leaseId(), t.clientName(), t.dead());
  }

  private static SharedBlockSnapshot sharedBlock(SharedBlock b) {
    SharedBlock.Holds holds = b.snapshot();
    Block block = b.block();
    if (holds.returned()) {
      throw new IllegalStateException("shared block of segment " + block.segmentId() + " offset " + block.offset()
          + " went back to its pool but is still referenced");
    }
    int waiting = 0;
    for (CompletionEvent e : b.keptEvents()) {
      if (!e.isComplete()) {
        waiting++;
      }
    }
    if (waiting > 0) {
      throw new IllegalStateException("shared block of segment " + block.segmentId() + " offset " + block.offset()
          + " waits for " + waiting + " completion events of holders that released it; they cannot move to "
          + "another process: retry the take-over once the GPU work on it has completed");
    }
    List<String> recordIds = new ArrayList<>();
    holds.records().forEach(r -> recordIds.add(r.id()));
    return new SharedBlockSnapshot(block.device(), block.segmentId(), block.offset(), block.size(), b.sizeBytes(),
        b.leasedBy().key(), b.leasedBySessionId(), recordIds, new ArrayList<>(holds.names()), holds.tokens());
  }
}
