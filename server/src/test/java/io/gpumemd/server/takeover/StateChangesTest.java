package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.pool.PoolSnapshot;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.session.SessionsSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.LeaseSnapshot;
import io.gpumemd.server.takeover.StateChanges.Changes;
import io.gpumemd.server.takeover.TakeOverState.Books;
import io.gpumemd.server.testing.FakeTicker;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The books sent ahead of a take-over's pause and the changes inside it ({@link StateChanges}):
 * real pools and a real registry on the host backend are written down ({@link
 * TakeOverState#write}), changed as a node changes them (leases granted and released, a session
 * opened and one closed, a token, a lease cached by its client, segments made), and written
 * again; the first writing with the changes applied must be the second, record for record,
 * straight and through the wire, and the changes must carry only what changed.
 */
class StateChangesTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000 pid 21", false, 2000, 2000, 21, "pid 21");

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private OutgoingDescriptors descriptors;

  @BeforeEach
  void start() {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 256 * MIB, null, "/run/gpumemd/gpumemd.sock.fd");
    LiveSessions sessions = new LiveSessions();
    pools = new DevicePools(List.of(new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(256 * MIB, 256 * MIB, 20 * MIB, 0, 64 * MIB), sessions, DevicePools.segmentIdBase(0),
        ticker)));
    registry = new SessionRegistry(pools, backend,
        new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of(), 4 * MIB), ticker, sessions);
    descriptors = new OutgoingDescriptors(List.of());
  }

  @AfterEach
  void close() {
    descriptors.close();
    pools.get(0).verifyInvariants();
    pools.close();
    backend.close();
  }

  private Books write() throws TakeOverRefusedException {
    return TakeOverState.write(pools, registry, descriptors);
  }

  private LeaseRecord lease(Caller caller, Session session, long size, String tag) {
    return registry.lease(caller, session.id(), 0, size, false, tag, false);
  }

  /** The books as the successor gets them: the first writing and the changes, each through the wire. */
  private static Books overTheWire(Books before, Changes changes) {
    return StateChanges.apply(TakeOverState.fromProto(TakeOverState.toProto(before).build()),
        StateChanges.fromProto(StateChanges.toProto(changes).build()));
  }

  private static void assertSameBooks(Books expected, Books actual) {
    assertEquals(expected.pools(), actual.pools());
    assertEquals(expected.sessions(), actual.sessions());
  }

  @Test
  void changesAppliedToTheBooksAhead_giveTheLaterBooks_andCarryOnlyWhatChanged() throws Exception {
    Session alice = registry.open(ALICE, "alice", 60, 2 * MIB);
    Session bob = registry.open(BOB, "bob", 30, 0);
    List<LeaseRecord> held = new ArrayList<>();
    for (int i = 0; i < 200; i++) {
      held.add(lease(i % 2 == 0 ? ALICE : BOB, i % 2 == 0 ? alice : bob, 4096 + 512L * i, "t" + i));
    }
    LeaseRecord toCache = lease(ALICE, alice, 50_000, "cached later");
    LeaseRecord toShare = lease(ALICE, alice, 100_000, "shared later");
    Books before = write();

    ticker.advance(5, TimeUnit.SECONDS);
    Set<String> released = new HashSet<>();
    for (int i = 190; i < 200; i += 3) { // the last granted: on the last segments only
      LeaseRecord r = held.get(i);
      registry.release(i % 2 == 0 ? ALICE : BOB, r.session().id(), r.id(), new byte[0]);
      released.add(r.id());
    }
    assertEquals(List.of(), registry.clientCache().cached(alice, List.of(toCache.id())));
    registry.sharing().share(ALICE, alice.id(), toShare.id(), 600, false, 3);
    Session carol = registry.open(BOB, "carol", 30, 0);
    Set<String> granted = new HashSet<>();
    for (int i = 0; i < 5; i++) {
      granted.add(lease(BOB, carol, 24 * MIB, "a new segment").id()); // larger than any segment so far
    }
    ticker.advance(1, TimeUnit.SECONDS);
    Books after = write();

    Changes changes = StateChanges.between(before, after);

    assertSameBooks(after, StateChanges.apply(before, changes));
    assertSameBooks(TakeOverState.fromProto(TakeOverState.toProto(after).build()), overTheWire(before, changes));
    assertEquals(released, new HashSet<>(changes.removedLeaseIds()));
    Set<String> carried = new HashSet<>();
    changes.sessions().leases().forEach(l -> carried.add(l.id()));
    // The new leases, and the cached one; the shared one only if sharing changed its record.
    assertTrue(carried.containsAll(granted) && carried.contains(toCache.id()), carried.toString());
    assertTrue(carried.size() <= granted.size() + 2, "only what changed is carried: " + carried);
    assertEquals(TimeUnit.SECONDS.toNanos(6), changes.elapsedNanos());
    int segmentsAfter = after.pools().get(0).segments().size();
    int segmentsCarried = changes.pools().get(0).segments().size();
    assertTrue(segmentsCarried > 0 && segmentsCarried < segmentsAfter,
        "segments carried: " + segmentsCarried + " of " + segmentsAfter);
  }

  @Test
  void booksThatDidNotChange_carryNoLeaseAndNoSegment_theLeasesOnlyAged() throws Exception {
    Session alice = registry.open(ALICE, "alice", 60, 0);
    for (int i = 0; i < 50; i++) {
      lease(ALICE, alice, 8192, "");
    }
    Books before = write();
    ticker.advance(250, TimeUnit.MILLISECONDS);
    Books after = write();

    Changes changes = StateChanges.between(before, after);

    assertEquals(List.of(), changes.sessions().leases());
    assertEquals(List.of(), changes.removedLeaseIds());
    assertEquals(List.of(), changes.pools().get(0).segments());
    Books applied = StateChanges.apply(before, changes);
    assertSameBooks(after, applied);
    LeaseSnapshot first = applied.sessions().leases().get(0);
    assertEquals(before.sessions().leases().get(0).grantedAgeNanos() + TimeUnit.MILLISECONDS.toNanos(250),
        first.grantedAgeNanos());
  }

  @Test
  void changesThatDoNotFitTheBooksAhead_areRefused_namingWhat() throws Exception {
    Session alice = registry.open(ALICE, "alice", 60, 0);
    lease(ALICE, alice, 8192, "");
    Books before = write();
    Changes none = StateChanges.between(before, write());

    Changes goneUnknown = new Changes(none.pools(), none.segmentIds(), none.sessions(),
        List.of("lease-that-never-was"), 0);
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> StateChanges.apply(before, goneUnknown));
    assertEquals("lease lease-that-never-was is gone in the changes but not in the books sent ahead", e.getMessage());

    List<Long> ids = new ArrayList<>(none.segmentIds().get(0));
    ids.add(999_999L);
    Changes segmentUnknown = new Changes(none.pools(), List.of(ids), none.sessions(), List.of(), 0);
    e = assertThrows(IllegalStateException.class, () -> StateChanges.apply(before, segmentUnknown));
    assertEquals("device 0: segment 999999 is neither in the books sent ahead nor among the changes", e.getMessage());
  }

  @Test
  void leasesOutOfGrantOrder_areRefused_ratherThanCompared() throws Exception {
    Session alice = registry.open(ALICE, "alice", 60, 0);
    lease(ALICE, alice, 8192, "");
    lease(ALICE, alice, 8192, "");
    Books written = write();
    SessionsSnapshot s = written.sessions();
    List<LeaseSnapshot> reversed = new ArrayList<>(s.leases());
    java.util.Collections.reverse(reversed);
    Books shuffled = new Books(written.pools(), s.withLeases(reversed), written.writtenAtNanos());

    IllegalStateException e = assertThrows(IllegalStateException.class,
        () -> StateChanges.between(written, shuffled));

    assertTrue(e.getMessage().startsWith("the leases are not written in grant order"), e.getMessage());
  }

  @Test
  void aSegmentSentWithTheBooksAhead_isNamedByThatIndexLater_andSentOnce() throws Exception {
    Session alice = registry.open(ALICE, "alice", 60, 0);
    lease(ALICE, alice, 8192, "");
    Books before = write();
    int sentAhead = descriptors.pending().size();
    descriptors.sent();
    lease(ALICE, alice, 48 * MIB, "a new segment");

    Books after = write();

    assertEquals(1, descriptors.pending().size(), "only the new segment's descriptor is sent with the changes");
    List<PoolSnapshot.SegmentSnapshot> carried = StateChanges.between(before, after).pools().get(0).segments();
    assertEquals(1, carried.size());
    assertEquals(sentAhead, carried.get(0).descriptorIndex());
  }
}
