package io.gpumemd.server.session;

import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.Tenant;
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.server.sharing.ShareToken;
import io.gpumemd.server.sharing.PublishedObject;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.takeover.v1.LeaseState;
import io.gpumemd.proto.takeover.v1.SessionState;
import io.gpumemd.proto.takeover.v1.SessionsState;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.takeover.SessionsStates;
import io.gpumemd.server.takeover.TakeOverState;
import io.gpumemd.server.testing.LogCapture;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The session layer's half of a take-over: registry A is written down and put on the wire
 * ({@link SessionRegistry#snapshot}, {@link SessionsStates}), and a fresh registry B, built as
 * the daemon builds one, is restored from the wire's state ({@link TakeOverState#restoreSessions})
 * over the same pools (A is abandoned without ending its sessions, so the pool side is already
 * right and only the session layer moves). B must list what A listed, keep serving tokens, names, releases and ends as A
 * would have, continue the lease sequence, and balance its books and the pool's to zero.
 */
class SessionsTakeOverTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000 pid 11", false, 1000, 1000, 11, "pid 11");
  private static final Caller ALICE2 = new Caller("uid:1000", "uid 1000 pid 12", false, 1000, 1000, 12, "pid 12");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000 pid 21", false, 2000, 2000, 21, "pid 21");
  private static final byte[] NO_EVENT = new byte[0];

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry a;

  private void start() {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(64 * MIB, 64 * MIB, 20 * MIB, 0, 64 * MIB), sessions, DevicePools.segmentIdBase(0), ticker);
    pools = new DevicePools(List.of(pool));
    a = new SessionRegistry(pools, backend, settings(), ticker, sessions);
  }

  private static SessionSettings settings() {
    return new SessionSettings(30, 3600, 2000, 0, Quota.UNLIMITED, Map.of(), 4 * MIB);
  }

  /** A registry as GpumemdServer builds one, on the same pools. */
  private SessionRegistry fresh(SessionSettings settings) {
    return new SessionRegistry(pools, backend, settings, ticker, new LiveSessions());
  }

  @AfterEach
  void verifyAndClose() {
    if (pools != null) {
      pools.get(0).verifyInvariants();
      pools.close();
      backend.close();
    }
  }

  private long stat(PoolMetric metric) {
    return pools.get(0).stats().get(metric);
  }

  private static LeaseRecord lease(SessionRegistry r, Caller caller, Session s, long size, String tag) {
    return r.lease(caller, s.id(), 0, size, false, tag, false);
  }

  /** What A made: the sessions, leases and tokens a test goes on with in B. */
  private record Made(Session producer, Session consumer, Session bob, LeaseRecord shared, LeaseRecord published,
      LeaseRecord cached, LeaseRecord plain, LeaseRecord bobs, LeaseRecord holdByToken, LeaseRecord holdByName,
      String token) {}

  /** Two tenants, leases, a client-cached lease, a token with attaches left, holds by token and name. */
  private Made populate() {
    Session producer = a.open(ALICE, "producer", 60, 2 * MIB);
    Session consumer = a.open(ALICE2, "consumer", 0, -1);
    Session bob = a.open(BOB, "bob", 30, 0);
    LeaseRecord shared = lease(a, ALICE, producer, 100_000, "kv");
    LeaseRecord published = lease(a, ALICE, producer, 200_000, "weights");
    LeaseRecord cached = lease(a, ALICE, producer, 50_000, "scratch");
    LeaseRecord plain = lease(a, ALICE, producer, 300_000, "plain");
    LeaseRecord bobs = lease(a, BOB, bob, MIB, "bob's");
    assertEquals(List.of(), a.clientCache().cached(producer, List.of(cached.id())));
    a.clientCache().clientCounters(producer, 0, 10, 2);
    SharedObjects.Share share = a.sharing().share(ALICE, producer.id(), shared.id(), 600, false, 3);
    LeaseRecord holdByToken = a.sharing().attach(ALICE2, consumer.id(), share.token(), "by-token");
    a.sharing().publish(ALICE, producer.id(), published.id(), "weights", true);
    LeaseRecord holdByName = a.sharing().lookup(ALICE2, consumer.id(), "weights", "by-name");
    assertTrue(holdByName.readOnly());
    a.attach(ALICE, producer.id(), new RecordingChannel());
    producer.messageApplied();
    producer.messageApplied();
    producer.messageApplied();
    return new Made(producer, consumer, bob, shared, published, cached, plain, bobs, holdByToken, holdByName,
        share.token());
  }

  // ------------------------------------------------------------------------------ views

  private static String view(LeaseRecord r) {
    return String.join("|", r.id(), r.session().id(), "" + r.block().device(), "" + r.block().segmentId(),
        "" + r.block().offset(), "" + r.block().size(), "" + r.sizeBytes(), r.tag(), "" + r.grantedNanos(),
        "" + r.sequence(), "" + r.poolHit(), "" + r.attached(), "" + r.readOnly(),
        r.shared() == null ? "-" : r.shared().holds() + " " + r.shared().holderSessionIds() + " " + r.shared().name());
  }

  private static String view(Session s) {
    return String.join("|", s.id(), s.tenant(), s.owner().toString(), s.clientName(), "" + s.ttlSeconds(),
        "" + s.openedNanos(), Arrays.toString(s.holdings()), "" + s.cacheAllowance(),
        Arrays.toString(s.clientCounters()), "" + s.appliedMessages(), s.quota().toString(),
        s.segmentOwner().toString());
  }

  private static String view(ShareToken t) {
    return String.join("|", t.id(), t.tenant(), t.sessionId(), t.leaseId(), t.clientName(), "" + t.readOnly(),
        "" + t.maxAttaches(), "" + t.attaches(), "" + t.createdNanos(), "" + t.expiresNanos(),
        "" + t.shared().holds(), "" + t.shared().block().segmentId(), "" + t.shared().block().offset());
  }

  private static String view(PublishedObject o) {
    return String.join("|", o.tenant(), o.name(), "" + o.readOnly(), "" + o.publishedNanos(), o.publishedBy(),
        "" + o.lookups().get(), "" + o.shared().holds(), "" + o.shared().block().segmentId(),
        "" + o.shared().block().offset());
  }

  private static List<String> listings(SessionRegistry r) {
    List<String> out = new ArrayList<>();
    r.leases(Caller.DAEMON, null, "").forEach(l -> out.add("lease " + view(l)));
    r.sessionPage(Caller.DAEMON, 0, null, 100).items().forEach(s -> out.add("session " + view(s)));
    r.sharing().shares(Caller.DAEMON, "", null, 100).items().forEach(t -> out.add("share " + view(t)));
    r.sharing().objects(Caller.DAEMON, null, null, 100).items().forEach(o -> out.add("object " + view(o)));
    for (String tenant : List.of("uid:1000", "uid:2000")) {
      Tenant t = r.tenant(tenant);
      out.add("tenant " + tenant + " " + Arrays.toString(t.holdings()) + " sessions " + t.sessions()
          + " shares " + t.shares() + " holds " + t.holds());
    }
    return out;
  }

  /** The registry written down and put on the wire, as the running daemon sends it. */
  private static SessionsState export(SessionRegistry registry) {
    return SessionsStates.toProto(registry.snapshot(registry.nanos()));
  }

  /** The successor's restore of the wire's state, with its log lines. */
  private static void restore(SessionRegistry registry, SessionsState state) {
    TakeOverState.restoreSessions(state, registry);
  }

  /** The export with what a restore changes by rule: every session comes back detached. */
  private static SessionsState detached(SessionsState state) {
    SessionsState.Builder b = state.toBuilder();
    for (SessionState.Builder s : b.getSessionsBuilderList()) {
      s.setStreamAttached(false).setDetachedAgeNanos(0);
    }
    return b.build();
  }

  // ------------------------------------------------------------------------------ tests

  @Test
  void restoredRegistry_listsWhatTheHolderListed_andServesOnAsItWould() {
    start();
    Made m = populate();
    ticker.advance(20, TimeUnit.SECONDS);
    a.session(ALICE2, m.consumer().id()); // the consumer was seen at +20 s, bob last at 0
    long leasedBefore = stat(PoolMetric.LEASED_BYTES);
    long cachedBefore = stat(PoolMetric.CLIENT_CACHED_BYTES);
    List<String> listedByA = listings(a);
    SessionsState state = export(a);
    assertEquals(3, state.getSessionsCount());
    assertEquals(7, state.getLeasesCount(), "5 leases and 2 holds");
    assertEquals(2, state.getSharedBlocksCount());
    assertEquals(1, state.getTokensCount());
    assertEquals(1, state.getObjectsCount());
    assertEquals(3, state.getChurn().getOpened());

    SessionRegistry b = fresh(settings());
    restore(b, state);

    assertEquals(listedByA, listings(b));
    assertTrue(b.sessions(Caller.DAEMON).stream().noneMatch(Session::streamAttached), "sessions come back detached");
    assertEquals(detached(state), export(b), "a restored registry exports what it was restored from");
    assertEquals(leasedBefore, stat(PoolMetric.LEASED_BYTES), "a restore leaves the pool alone");
    assertEquals(cachedBefore, stat(PoolMetric.CLIENT_CACHED_BYTES));
    // TTL from the last call before the move: bob (never a stream, last seen 20 s before the
    // export) ends 10+ s after it, giving back his lease; the consumer (seen at the export)
    // lives, and so does the producer, whose client reattaches within its grace.
    b.attach(ALICE, m.producer().id(), new RecordingChannel());
    ticker.advance(9, TimeUnit.SECONDS);
    b.reap();
    assertEquals(3, b.sessionCount());
    // (A released block's size is the pool's to change as it merges free neighbours: read it before.)
    long bobsBlock = m.bobs().block().size();
    long leasedThen = stat(PoolMetric.LEASED_BYTES);
    ticker.advance(2, TimeUnit.SECONDS);
    b.reap();
    assertThrows(NotFoundException.class, () -> b.session(BOB, m.bob().id()));
    assertEquals(leasedThen - bobsBlock, stat(PoolMetric.LEASED_BYTES),
        "bob's ended session gave its lease back");
    assertEquals(2, b.sessionCount());
    assertNotNull(b.session(ALICE2, m.consumer().id()));

    Session producer = b.session(ALICE, m.producer().id());
    assertEquals(3, producer.appliedMessages());
    assertArrayEquals(new long[] {10, 2}, producer.clientCounters());
    assertEquals(2 * MIB, producer.cacheAllowance());

    // The token had 2 of its 3 attaches left: exactly 2 more are served, the second retires it.
    Session second = b.open(ALICE, "second", 0, 0);
    LeaseRecord hold2 = b.sharing().attach(ALICE, second.id(), m.token(), "t2");
    assertEquals(m.shared().block(), hold2.block());
    assertEquals(2, b.sharing().shares(Caller.DAEMON, "", null, 10).items().get(0).attaches());
    b.sharing().attach(ALICE, second.id(), m.token(), "t3");
    assertEquals(0, b.sharing().tokenCount(), "the third attach used the token up");
    assertThrows(NotFoundException.class, () -> b.sharing().attach(ALICE, second.id(), m.token(), "t4"));

    // Names: found by the tenant, read-only as published, not by another tenant; lookups counted on.
    LeaseRecord byName = b.sharing().lookup(ALICE, second.id(), "weights", "n2");
    assertTrue(byName.readOnly());
    assertEquals(m.published().block(), byName.block());
    Session bob = b.open(BOB, "bob again", 0, 0);
    assertThrows(NotFoundException.class, () -> b.sharing().lookup(BOB, bob.id(), "weights", "x"));
    assertEquals(2, b.sharing().objects(Caller.DAEMON, null, null, 10).items().get(0).lookups().get());

    // The client-cached lease is the client's to reuse, in B's books and the pool's.
    assertEquals(List.of(), b.clientCache().reused(producer, List.of(m.cached().id())));
    assertEquals(cachedBefore - m.cached().block().size(), stat(PoolMetric.CLIENT_CACHED_BYTES));

    // A release returns the block to the pool; a repeat is refused as in A.
    long leased = stat(PoolMetric.LEASED_BYTES);
    long plainBlock = m.plain().block().size();
    b.release(ALICE, producer.id(), m.plain().id(), NO_EVENT);
    assertEquals(leased - plainBlock, stat(PoolMetric.LEASED_BYTES));
    assertThrows(NotFoundException.class, () -> b.release(ALICE, producer.id(), m.plain().id(), NO_EVENT));

    // Ids continue: a new lease's sequence comes after every one A gave out, and no id repeats.
    LeaseRecord fresh = lease(b, ALICE, producer, 4096, "new");
    long lastOfA = state.getLeasesList().stream().mapToLong(LeaseState::getSequence).max().orElseThrow();
    assertTrue(fresh.sequence() > lastOfA, fresh.sequence() + " after " + lastOfA);
    assertTrue(hold2.sequence() > lastOfA && byName.sequence() > lastOfA);
    Set<String> idsOfA = state.getLeasesList().stream().map(LeaseState::getId).collect(Collectors.toSet());
    assertFalse(idsOfA.contains(fresh.id()));

    // Everything ends: the pool holds nothing leased, and every tenant's books are back to zero.
    b.endAll("test");
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.CLIENT_CACHED_BYTES));
    assertEquals(0, stat(PoolMetric.SHARED_BLOCKS));
    assertEquals(0, stat(PoolMetric.LIVE_HOLDS));
    assertEquals(0, stat(PoolMetric.PUBLISHED_BYTES));
    for (String tenant : List.of("uid:1000", "uid:2000")) {
      Tenant t = b.tenant(tenant);
      assertArrayEquals(new long[] {0, 0}, t.holdings(), tenant);
      assertEquals(0, t.sessions() + t.shares() + t.holds(), tenant);
    }
    pools.get(0).verifyInvariants();
  }

  @Test
  void sessionThatHadAStream_countsItsGraceFromTheRestore() {
    start();
    Session s = a.open(ALICE, "streamed", 30, 0);
    RecordingChannel channel = new RecordingChannel();
    a.attach(ALICE, s.id(), channel);
    a.detach(s, channel);
    ticker.advance(1900, TimeUnit.MILLISECONDS); // 100 ms of its 2 s grace left at the export
    LeaseRecord lease = lease(a, ALICE, s, 4096, "x");
    SessionsState state = export(a);
    assertTrue(state.getSessions(0).getHadStream());
    assertEquals(TimeUnit.MILLISECONDS.toNanos(1900), state.getSessions(0).getDetachedAgeNanos());

    SessionRegistry b = fresh(settings());
    restore(b, state);
    ticker.advance(1500, TimeUnit.MILLISECONDS);
    b.reap();
    assertEquals(1, b.sessionCount(), "the grace counts from the restore, not from the old detach");
    ticker.advance(600, TimeUnit.MILLISECONDS);
    b.reap();
    assertEquals(0, b.sessionCount(), "not reattached within the grace: ended");
    assertEquals(0, stat(PoolMetric.LEASED_BYTES), "its lease " + lease.id() + " went back");
  }

  @Test
  void leaseNamingABlockThatIsNotThere_failsTheRestore_registeringNothing() {
    start();
    Made m = populate();
    SessionsState good = export(a);
    SessionsState.Builder bad = good.toBuilder();
    int i = indexOf(good, m.bobs().id());
    bad.getLeasesBuilder(i).setSegmentId(m.bobs().block().segmentId() + 1000);
    SessionRegistry b = fresh(settings());
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> restore(b, bad.build()));
    assertTrue(e.getMessage().contains("lease " + m.bobs().id()), e.getMessage());
    assertTrue(e.getMessage().contains("no block"), e.getMessage());
    assertEquals(0, b.sessionCount());
    assertEquals(0, b.liveLeases());
    assertEquals(0, b.sharing().tokenCount());
    assertEquals(0, b.sharing().objects(Caller.DAEMON, null, null, 10).items().size());
    assertThrows(NotFoundException.class, () -> b.session(BOB, m.bob().id()));
  }

  @Test
  void leaseWhoseBlockWentBackToThePool_failsTheRestore() {
    start();
    Made m = populate();
    SessionsState state = export(a);
    a.release(ALICE, m.producer().id(), m.plain().id(), NO_EVENT); // the pool's side no longer matches
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> restore(fresh(settings()), state));
    assertTrue(e.getMessage().contains("lease " + m.plain().id()), e.getMessage());
  }

  @Test
  void clientCachedFlagThatThePoolDoesNotShare_failsTheRestore() {
    start();
    Made m = populate();
    SessionsState.Builder bad = export(a).toBuilder();
    bad.getLeasesBuilder(indexOf(bad.build(), m.plain().id())).setClientCached(true);
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> restore(fresh(settings()), bad.build()));
    assertTrue(e.getMessage().contains("lease " + m.plain().id()) && e.getMessage().contains("LEASED"),
        e.getMessage());
  }

  @Test
  void restoreIntoARegistryInUse_isRefused() {
    start();
    populate();
    SessionsState state = export(a);
    SessionRegistry b = fresh(settings());
    b.open(BOB, "early", 0, 0);
    assertThrows(IllegalStateException.class, () -> restore(b, state));
  }

  @Test
  void takersSmallerQuotas_keepEveryRestoredLease_warnOnce_andRefuseNewOnes() {
    start();
    Made m = populate();
    SessionsState state = export(a);
    SessionSettings tight = new SessionSettings(10, 10, 2000, 0, new Quota(0, 1), Map.of(), MIB,
        new Quota(MIB / 2, 0), false);
    SessionRegistry b = fresh(tight);
    try (LogCapture log = new LogCapture(TakeOverState.class)) {
      restore(b, state);
      List<String> warnings = log.messages("WARN");
      assertEquals(1, warnings.size(), warnings.toString());
      assertTrue(warnings.get(0).contains("over this daemon's quotas"), warnings.get(0));
    }
    assertEquals(state.getLeasesCount(), b.liveLeases(), "no restored lease is dropped");
    Session producer = b.session(ALICE, m.producer().id());
    assertEquals(10, producer.ttlSeconds(), "the taker's --max-ttl applies");
    assertEquals(MIB, producer.cacheAllowance(), "the taker's client cache cap applies");
    assertArrayEquals(new long[] {4, m.shared().block().size() + m.published().block().size()
        + m.cached().block().size() + m.plain().block().size()}, producer.quotaUsage());
    assertThrows(ExhaustedException.class, () -> lease(b, ALICE, producer, 4096, "over"));
    b.endAll("test");
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.CLIENT_CACHED_BYTES));
  }

  @Test
  void leaseIdsAndTokensSurviveTwoMovesInARow() {
    start();
    Made m = populate();
    SessionRegistry b = fresh(settings());
    restore(b, export(a));
    ticker.advance(1, TimeUnit.SECONDS);
    LeaseRecord inB = lease(b, BOB, b.session(BOB, m.bob().id()), 8192, "in b");
    SessionsState fromB = export(b);
    SessionRegistry c = fresh(settings());
    restore(c, fromB);
    assertEquals(listings(b), listings(c));
    LeaseRecord inC = lease(c, BOB, c.session(BOB, m.bob().id()), 8192, "in c");
    assertTrue(inC.sequence() > inB.sequence());
    Set<String> ids = new HashSet<>();
    c.leases(Caller.DAEMON, null, "").forEach(l -> assertTrue(ids.add(l.id()), "repeated " + l.id()));
    c.sharing().attach(ALICE2, m.consumer().id(), m.token(), "in c");
    c.endAll("test");
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
  }

  private static int indexOf(SessionsState state, String leaseId) {
    for (int i = 0; i < state.getLeasesCount(); i++) {
      if (state.getLeases(i).getId().equals(leaseId)) {
        return i;
      }
    }
    throw new AssertionError("lease " + leaseId + " not in the state");
  }
}
