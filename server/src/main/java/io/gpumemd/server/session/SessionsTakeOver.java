package io.gpumemd.server.session;

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Ticker;
import io.gpumemd.proto.takeover.v1.CallerState;
import io.gpumemd.proto.takeover.v1.LeaseState;
import io.gpumemd.proto.takeover.v1.PublishedObjectState;
import io.gpumemd.proto.takeover.v1.ReportedClientCounters;
import io.gpumemd.proto.takeover.v1.SegmentOwnerState;
import io.gpumemd.proto.takeover.v1.SessionChurnState;
import io.gpumemd.proto.takeover.v1.SessionState;
import io.gpumemd.proto.takeover.v1.SessionsState;
import io.gpumemd.proto.takeover.v1.ShareTokenState;
import io.gpumemd.proto.takeover.v1.SharedBlockState;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePools;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The session layer's half of a take-over ({@code gpumemd --take-over}): writes the registry's
 * rooms into a {@link SessionsState} on the holder, and rebuilds them from one on the taker,
 * over pools that the pool layer has already restored (every block a lease names is there,
 * LEASED or CLIENT_CACHED, and the pool's own books about it are the pool's: nothing here
 * calls the pool but {@link io.gpumemd.server.pool.DevicePool#blockAt}).
 *
 * <p>What is carried and what is derived: sessions, records, shared blocks, tokens, names, the
 * lease sequence and the churn window are carried; each session's and tenant's quota usage,
 * session and share and hold counts are recounted from them; quotas, the TTL bound and the
 * client cache cap are the taker's own configuration, applied without ever shrinking what is
 * leased (restored usage over a quota stays, with one WARN). Tenants' open-rate buckets and the
 * reaper's scan throttles start afresh.
 *
 * <p>Restore is build-then-register: every object is built and every cross-reference checked
 * before anything enters the registry's maps, so a state that does not fit throws
 * {@link IllegalStateException} naming what is wrong, with nothing live registered (tenant
 * entries may have been created, empty; the caller discards the registry anyway).
 *
 * <p>Thread-safety: export runs while no request is applied (the take-over gate) but still
 * reads each object under the monitor that guards it; restore runs on a registry that serves
 * nothing yet. One call at a time.
 */
final class SessionsTakeOver {
  private static final Logger log = LoggerFactory.getLogger(SessionRegistry.class);
  /** Over-quota sessions or tenants named in the one WARN; the rest are counted. */
  private static final int NAMED_IN_WARNING = 5;

  private final DevicePools pools;
  private final SessionSettings settings;
  private final Ticker ticker;
  private final LiveSessions sessions;
  private final SessionDirectory directory;
  private final LeaseBook book;
  private final SharedObjects sharing;
  private final SessionChurn churn;

  SessionsTakeOver(DevicePools pools, SessionSettings settings, Ticker ticker, LiveSessions sessions,
      SessionDirectory directory, LeaseBook book, SharedObjects sharing, SessionChurn churn) {
    this.pools = pools;
    this.settings = settings;
    this.ticker = ticker;
    this.sessions = sessions;
    this.directory = directory;
    this.book = book;
    this.sharing = sharing;
    this.churn = churn;
  }

  // ------------------------------------------------------------------------------ export

  /**
   * The registry's state, instants as ages from now.
   *
   * @throws IllegalStateException when the books disagree (a record its session does not hold),
   *     or a shared block still waits for a released holder's completion event, which cannot
   *     move to another process (the holder refuses the take-over and may retry)
   */
  SessionsState export() {
    long now = ticker.nanos();
    SessionsState.Builder out = SessionsState.newBuilder();
    out.setLeaseSequence(book.sequence());

    List<Session> live = new ArrayList<>(sessions.all());
    live.sort(SessionRegistry.SESSION_ORDER);
    Map<String, Boolean> clientCached = new HashMap<>();
    Map<Session, Session.Exported> exported = new IdentityHashMap<>();
    for (Session s : live) {
      Session.Exported e = s.exportState();
      exported.put(s, e);
      clientCached.putAll(e.clientCached());
      out.addSessions(sessionState(s, e, now));
    }

    Map<SharedBlock, Integer> index = new IdentityHashMap<>();
    List<SharedBlock> blocks = new ArrayList<>();
    List<LeaseRecord> records = new ArrayList<>(book.all());
    records.sort(SessionRegistry.LEASE_ORDER);
    for (LeaseRecord r : records) {
      Boolean cached = clientCached.get(r.id());
      if (cached == null || exported.get(r.session()) == null) {
        throw new IllegalStateException("lease " + r.id() + " of " + r.session()
            + " is in the lease book but not among its live session's leases");
      }
      out.addLeases(leaseState(r, cached, indexOf(r.shared(), index, blocks), now));
    }

    List<ShareToken> tokens = new ArrayList<>(sharing.allTokens());
    tokens.sort(SharedObjects.TOKEN_ORDER);
    for (ShareToken t : tokens) {
      out.addTokens(tokenState(t, indexOf(t.shared, index, blocks), now));
    }
    List<PublishedObject> objects = new ArrayList<>(sharing.allObjects());
    objects.sort(SharedObjects.OBJECT_ORDER);
    for (PublishedObject o : objects) {
      out.addObjects(PublishedObjectState.newBuilder().setTenant(o.tenant()).setName(o.name())
          .setSharedBlock(indexOf(o.shared(), index, blocks)).setReadOnly(o.readOnly())
          .setPublishedAgeNanos(now - o.publishedNanos()).setPublishedBy(o.publishedBy())
          .setLookups(o.lookups().get()));
    }
    for (SharedBlock b : blocks) {
      out.addSharedBlocks(sharedBlockState(b));
    }

    long[] c = churn.export();
    out.setChurn(SessionChurnState.newBuilder().setWindowAgeNanos(now - c[0]).setOpened(c[1]).setEnded(c[2])
        .setEndedHolding(c[3]).setReleasedLeases(c[4]).setReleasedBytes(c[5]).setRefusedTotal(c[6])
        .setRefusedPerTenant(c[7]).setRefusedRate(c[8]).setHoldingToldSingly((int) c[9]));
    return out.build();
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

  private static SessionState sessionState(Session s, Session.Exported e, long now) {
    Caller c = s.owner();
    SegmentOwner so = s.segmentOwner();
    SessionState.Builder b = SessionState.newBuilder().setId(s.id())
        .setOwner(CallerState.newBuilder().setTenant(c.tenant()).setPrincipal(c.principal()).setAdmin(c.admin())
            .setUid(c.uid()).setGid(c.gid()).setPid(c.pid()).setOrigin(c.origin()))
        .setSegmentOwner(SegmentOwnerState.newBuilder().setKey(so.key()).setUid(so.uid()).setGid(so.gid()))
        .setClientName(s.clientName()).setTtlSeconds(s.ttlSeconds())
        .setOpenedAgeNanos(now - s.openedNanos()).setLastSeenAgeNanos(now - e.lastSeenNanos())
        .setHadStream(e.hadStream()).setStreamAttached(e.streamAttached())
        .setDetachedAgeNanos(e.hadStream() && !e.streamAttached() ? now - e.detachedNanos() : 0)
        .setGrantedCacheBytes(e.grantedCacheBytes()).setCacheAllowance(e.cacheAllowance())
        .setCacheReturnOverdue(e.cacheReturnOverdue()).setAppliedMessages(e.appliedMessages());
    new TreeSet<>(e.counters().keySet()).forEach(device -> {
      long[] v = e.counters().get(device);
      b.addReportedCounters(ReportedClientCounters.newBuilder().setDevice(device).setHits(v[0]).setReturns(v[1]));
    });
    return b.build();
  }

  private static LeaseState leaseState(LeaseRecord r, boolean clientCached, int sharedIndex, long now) {
    Block block = r.block();
    return LeaseState.newBuilder().setId(r.id()).setSessionId(r.session().id()).setDevice(block.device())
        .setSegmentId(block.segmentId()).setBlockOffset(block.offset()).setBlockSize(block.size())
        .setRequestedBytes(r.sizeBytes()).setTag(r.tag()).setGrantedAgeNanos(now - r.grantedNanos())
        .setSequence(r.sequence()).setPoolHit(r.poolHit()).setAttached(r.attached()).setReadOnly(r.readOnly())
        .setClientCached(clientCached).setLeakReported(r.leakReported).setSharedBlock(sharedIndex).build();
  }

  private static ShareTokenState tokenState(ShareToken t, int sharedIndex, long now) {
    return ShareTokenState.newBuilder().setToken(t.token).setId(t.id).setTenant(t.tenant)
        .setSharedBlock(sharedIndex).setReadOnly(t.readOnly).setMaxAttaches(t.maxAttaches)
        .setAttaches(t.attaches()).setCreatedAgeNanos(now - t.createdNanos).setExpiresInNanos(t.expiresNanos - now)
        .setSessionId(t.sessionId()).setLeaseId(t.leaseId()).setClientName(t.clientName()).setDead(t.dead())
        .build();
  }

  private static SharedBlockState sharedBlockState(SharedBlock b) {
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
    SharedBlockState.Builder out = SharedBlockState.newBuilder().setDevice(block.device())
        .setSegmentId(block.segmentId()).setBlockOffset(block.offset()).setBlockSize(block.size())
        .setRequestedBytes(b.sizeBytes()).setLeasedByTenant(b.leasedBy().key())
        .setLeasedBySessionId(b.leasedBySessionId()).addAllNames(holds.names()).setTokenCount(holds.tokens());
    holds.records().forEach(r -> out.addRecordIds(r.id()));
    return out.build();
  }

  // ------------------------------------------------------------------------------ restore

  /** What {@link #restore} counted, for its INFO line. */
  private int cappedTtls;
  private int cappedAllowances;

  /**
   * Rebuilds the registry from {@code state}; see the class javadoc for what is carried, what
   * is derived, and what a failure leaves.
   *
   * @throws IllegalStateException when the registry is not fresh, or the state does not fit
   *     the pools or itself (naming the lease, block, token or name)
   */
  void restore(SessionsState state) {
    if (sessions.size() != 0 || book.size() != 0 || sharing.tokenCount() != 0 || !sharing.allObjects().isEmpty()) {
      throw new IllegalStateException("take-over restore needs a fresh registry: this one has " + sessions.size()
          + " sessions, " + book.size() + " leases, " + sharing.tokenCount() + " share tokens");
    }
    long now = ticker.nanos();

    // Build: sessions, shared blocks, records, tokens, names; check every reference.
    Map<String, Session> byId = new LinkedHashMap<>();
    for (SessionState s : state.getSessionsList()) {
      Session session = session(s, now);
      if (byId.putIfAbsent(session.id(), session) != null) {
        throw new IllegalStateException("session " + s.getId() + " twice in the take-over state");
      }
    }
    Set<String> places = new HashSet<>();
    List<SharedBlock> blocks = new ArrayList<>();
    for (int i = 0; i < state.getSharedBlocksCount(); i++) {
      SharedBlockState b = state.getSharedBlocks(i);
      String what = "shared block " + i + " (leased by session " + b.getLeasedBySessionId() + ")";
      Block block = findBlock(what, b.getDevice(), b.getSegmentId(), b.getBlockOffset(), b.getBlockSize(), null);
      claim(places, what, block);
      blocks.add(new SharedBlock(block, b.getRequestedBytes(), directory.tenant(b.getLeasedByTenant()),
          b.getLeasedBySessionId()));
    }
    Map<String, LeaseRecord> records = new LinkedHashMap<>();
    long lastSequence = state.getLeaseSequence();
    for (LeaseState l : state.getLeasesList()) {
      LeaseRecord r = record(l, byId, blocks, places, now);
      if (records.putIfAbsent(r.id(), r) != null) {
        throw new IllegalStateException("lease " + l.getId() + " twice in the take-over state");
      }
      lastSequence = Math.max(lastSequence, r.sequence());
    }
    int[] tokenCounts = new int[blocks.size()];
    List<ShareToken> tokens = new ArrayList<>();
    Set<String> tokenIds = new HashSet<>();
    for (ShareTokenState t : state.getTokensList()) {
      String what = "share token " + t.getId();
      if (t.getDead()) {
        throw new IllegalStateException(what + " was killed but not yet dropped: the state was not taken quiet");
      }
      if (!SecureIds.isWellFormed(t.getToken()) || !SecureIds.isWellFormed(t.getId())
          || !tokenIds.add(t.getToken()) || !tokenIds.add(t.getId())) {
        throw new IllegalStateException(what + ": malformed or repeated token or id");
      }
      int i = blockIndex(what, t.getSharedBlock(), blocks);
      tokenCounts[i]++;
      tokens.add(new ShareToken(t.getToken(), t.getId(), t.getTenant(), t.getSessionId(), t.getClientName(),
          t.getLeaseId(), blocks.get(i), t.getReadOnly(), t.getMaxAttaches(), now - t.getCreatedAgeNanos(),
          now + t.getExpiresInNanos(), t.getAttaches(), false));
    }
    List<Set<String>> namesOf = new ArrayList<>();
    blocks.forEach(b -> namesOf.add(new TreeSet<>()));
    List<PublishedObject> objects = new ArrayList<>();
    Set<String> keys = new HashSet<>();
    for (PublishedObjectState o : state.getObjectsList()) {
      String what = "object '" + o.getName() + "' of tenant " + o.getTenant();
      if (!keys.add(PublishedObject.key(o.getTenant(), o.getName()))) {
        throw new IllegalStateException(what + " twice in the take-over state");
      }
      int i = blockIndex(what, o.getSharedBlock(), blocks);
      namesOf.get(i).add(o.getName());
      objects.add(new PublishedObject(o.getTenant(), o.getName(), blocks.get(i), o.getReadOnly(),
          now - o.getPublishedAgeNanos(), o.getPublishedBy(), new AtomicLong(o.getLookups())));
    }
    Map<SharedBlock, Integer> recordsNaming = new IdentityHashMap<>();
    records.values().stream().filter(r -> r.shared() != null).forEach(r -> recordsNaming.merge(r.shared(), 1, Integer::sum));
    for (int i = 0; i < blocks.size(); i++) {
      SharedBlock b = blocks.get(i);
      holdsOf(i, state.getSharedBlocks(i), b, records, tokenCounts[i], namesOf.get(i));
      // Every id it lists names it (holdsOf): equal counts mean it lists every record naming it.
      int listed = b.snapshot().records().size();
      if (listed != recordsNaming.getOrDefault(b, 0)) {
        throw new IllegalStateException("shared block " + i + " lists " + listed + " leases and holds, but "
            + recordsNaming.getOrDefault(b, 0) + " name it");
      }
    }
    for (LeaseRecord r : records.values()) {
      r.session().restoreRecord(r);
    }

    // Register: nothing below can fail on a state that passed the checks above.
    for (Session s : byId.values()) {
      sessions.restore(s);
      s.tenantUsage().addSession(0);
    }
    for (LeaseRecord r : records.values()) {
      Tenant tenant = r.session().tenantUsage();
      if (r.attached()) {
        tenant.reserveHold(0, "");
      } else if (r.shared() == null) {
        tenant.reserve(SizeClasses.roundUp(r.sizeBytes()), 0, Quota.UNLIMITED, "");
      }
    }
    for (SharedBlock b : blocks) {
      // A shared block's bytes stay its leasing tenant's until its last hold goes (LeaseBook#giveBack).
      b.leasedBy().reserve(SizeClasses.roundUp(b.sizeBytes()), 0, Quota.UNLIMITED, "");
    }
    tokens.forEach(t -> directory.tenant(t.tenant).addShare(0));
    objects.forEach(o -> directory.tenant(o.tenant()).addShare(0));
    book.restore(records.values(), lastSequence);
    sharing.restore(tokens, objects);
    SessionChurnState c = state.getChurn();
    churn.restore(new long[] {now - c.getWindowAgeNanos(), c.getOpened(), c.getEnded(), c.getEndedHolding(),
        c.getReleasedLeases(), c.getReleasedBytes(), c.getRefusedTotal(), c.getRefusedPerTenant(),
        c.getRefusedRate(), c.getHoldingToldSingly()});

    warnOverQuota(byId.values());
    log.atInfo().addKeyValue("sessions", byId.size()).addKeyValue("leases", records.size())
        .log("Take-over: restored {} sessions, {} leases and holds, {} shared blocks, {} share tokens, {} published "
            + "names; lease sequence continues after {}{}", byId.size(), records.size(), blocks.size(),
            tokens.size(), objects.size(), lastSequence,
            cappedTtls + cappedAllowances == 0 ? "" : "; capped to this daemon's configuration: " + cappedTtls
                + " TTLs (--max-ttl), " + cappedAllowances + " client cache allowances (--client-cache-bytes)");
  }

  /** A session as handed over, not yet live: detached, its grace (if it had a stream) from now. */
  private Session session(SessionState s, long now) {
    if (!SecureIds.isWellFormed(s.getId())) {
      throw new IllegalStateException("session id '" + s.getId() + "' in the take-over state is malformed");
    }
    try {
      return buildSession(s, now);
    } catch (IllegalArgumentException e) {
      throw new IllegalStateException("session " + s.getId() + " in the take-over state: " + e.getMessage(), e);
    }
  }

  private Session buildSession(SessionState s, long now) {
    CallerState o = s.getOwner();
    Caller caller = new Caller(o.getTenant(), o.getPrincipal(), o.getAdmin(), o.getUid(), o.getGid(), o.getPid(),
        o.getOrigin());
    if (caller.equals(Caller.DAEMON)) {
      caller = Caller.DAEMON; // Caller#owns knows the daemon by identity
    }
    SegmentOwnerState so = s.getSegmentOwner();
    int ttl = s.getTtlSeconds() <= 0 ? settings.defaultTtlSeconds() : Math.min(s.getTtlSeconds(),
        settings.maxTtlSeconds());
    if (ttl != s.getTtlSeconds()) {
      cappedTtls++;
    }
    long cap = settings.clientCacheBytes();
    long granted = Math.min(s.getGrantedCacheBytes(), cap);
    long allowance = Math.min(s.getCacheAllowance(), cap);
    if (granted != s.getGrantedCacheBytes()) {
      cappedAllowances++;
    }
    Session session = new Session(s.getId(), caller, directory.tenant(caller.tenant()),
        new SegmentOwner(so.getKey(), so.getUid(), so.getGid()), s.getClientName(), ttl,
        settings.quotaFor(s.getClientName()), granted, now - s.getOpenedAgeNanos());
    Map<Integer, long[]> counters = new HashMap<>();
    for (ReportedClientCounters rc : s.getReportedCountersList()) {
      counters.put(rc.getDevice(), new long[] {Math.max(0, rc.getHits()), Math.max(0, rc.getReturns())});
    }
    // Every session comes back detached. One that had a stream gets its whole grace from now, so
    // that its client, told to move or cut off by the move, reattaches in time; one that never
    // had one keeps the TTL it had left.
    session.restoreState(now - s.getLastSeenAgeNanos(), s.getHadStream(), now, allowance,
        s.getCacheReturnOverdue(), counters, s.getAppliedMessages());
    return session;
  }

  private LeaseRecord record(LeaseState l, Map<String, Session> byId, List<SharedBlock> blocks, Set<String> places,
      long now) {
    String what = "lease " + l.getId();
    if (!SecureIds.isWellFormed(l.getId())) {
      throw new IllegalStateException(what + ": malformed id in the take-over state");
    }
    Session session = byId.get(l.getSessionId());
    if (session == null) {
      throw new IllegalStateException(what + " names session " + l.getSessionId() + ", which is not in the state");
    }
    SharedBlock shared = l.getSharedBlock() < 0 ? null : blocks.get(blockIndex(what, l.getSharedBlock(), blocks));
    if (l.getAttached() && shared == null) {
      throw new IllegalStateException(what + " is a hold but names no shared block");
    }
    String expected = l.getClientCached() ? "CLIENT_CACHED" : "LEASED";
    Block block = findBlock(what, l.getDevice(), l.getSegmentId(), l.getBlockOffset(), l.getBlockSize(), expected);
    if (shared == null) {
      claim(places, what, block);
    } else if (shared.block() != block) {
      throw new IllegalStateException(what + " is on block " + block + " but its shared block is " + shared.block());
    }
    return new LeaseRecord(l.getId(), session, block, l.getRequestedBytes(), l.getTag(), now - l.getGrantedAgeNanos(),
        l.getSequence(), l.getPoolHit(), l.getAttached(), l.getReadOnly(), shared, l.getClientCached(),
        l.getLeakReported());
  }

  /**
   * The block a lease or shared block names, found in the restored pool.
   *
   * @param expected the state it must be in, or null for either leased state
   */
  private Block findBlock(String what, int device, long segmentId, long offset, long size, String expected) {
    if (device < 0 || device >= pools.all().size()) {
      throw new IllegalStateException(what + " is on device " + device + ", which this daemon does not have");
    }
    Block block = pools.get(device).blockAt(segmentId, offset);
    String where = "device " + device + ", segment " + segmentId + ", offset " + offset;
    if (block == null) {
      throw new IllegalStateException(what + ": the restored pool has no block at " + where);
    }
    String found = state(block);
    boolean held = found.equals("LEASED") || found.equals("CLIENT_CACHED");
    if (!held || (expected != null && !expected.equals(found))) {
      throw new IllegalStateException(what + ": the block at " + where + " is " + found + " in the restored pool, "
          + "expected " + (expected == null ? "LEASED or CLIENT_CACHED" : expected));
    }
    if (block.size() != size) {
      throw new IllegalStateException(what + ": the block at " + where + " has " + block.size()
          + " bytes in the restored pool, " + size + " in the state");
    }
    return block;
  }

  /** A block's state as the pool says it (the pool is quiet during a restore). */
  private static String state(Block block) {
    return block.stateName();
  }

  /** Each block is held by one lease or one shared block, never two. */
  private static void claim(Set<String> places, String what, Block block) {
    if (!places.add(block.device() + "/" + block.segmentId() + "/" + block.offset())) {
      throw new IllegalStateException(what + ": block " + block + " is named twice in the take-over state");
    }
  }

  private static int blockIndex(String what, int index, List<SharedBlock> blocks) {
    if (index < 0 || index >= blocks.size()) {
      throw new IllegalStateException(what + " names shared block " + index + " of " + blocks.size());
    }
    return index;
  }

  /** Adds a shared block's holds and checks them against the records, tokens and names naming it. */
  private static void holdsOf(int i, SharedBlockState state, SharedBlock shared, Map<String, LeaseRecord> records,
      int tokens, Set<String> names) {
    String what = "shared block " + i + " (segment " + state.getSegmentId() + ", offset " + state.getBlockOffset()
        + ")";
    for (String id : state.getRecordIdsList()) {
      LeaseRecord r = records.get(id);
      if (r == null || r.shared() != shared) {
        throw new IllegalStateException(what + " lists lease " + id + ", which is not a lease or hold on it");
      }
      shared.addRecord(r);
    }
    if (state.getTokenCount() != tokens) {
      throw new IllegalStateException(what + " counts " + state.getTokenCount() + " share tokens, " + tokens
          + " tokens name it");
    }
    if (!new TreeSet<>(state.getNamesList()).equals(names)) {
      throw new IllegalStateException(what + " has names " + state.getNamesList() + ", the objects naming it are "
          + names);
    }
    for (int t = 0; t < tokens; t++) {
      shared.addToken();
    }
    names.forEach(shared::addName);
    if (shared.holds() == 0) {
      throw new IllegalStateException(what + " has no holds: nothing would ever give it back");
    }
  }

  /** One WARN when restored usage is over this daemon's quotas: it stays, new leases are refused. */
  private void warnOverQuota(Iterable<Session> restored) {
    List<String> over = new ArrayList<>();
    int count = 0;
    Set<Tenant> tenants = Collections.newSetFromMap(new IdentityHashMap<>());
    for (Session s : restored) {
      long[] usage = s.quotaUsage();
      if (exceeds(s.quota(), usage)) {
        if (count++ < NAMED_IN_WARNING) {
          over.add(s + ": " + usage[0] + " leases, " + usage[1] + " bytes");
        }
      }
      tenants.add(s.tenantUsage());
    }
    for (Tenant t : tenants) {
      long[] usage = t.holdings();
      if (exceeds(settings.tenantQuota(), usage)) {
        if (count++ < NAMED_IN_WARNING) {
          over.add("tenant " + t.key() + ": " + usage[0] + " leases, " + usage[1] + " bytes");
        }
      }
    }
    if (count > 0) {
      log.warn("Take-over: restored usage is over this daemon's quotas for {} sessions or tenants ({}{}); their "
          + "leases stay, and new leases are refused until they fall below (flags --quota-max-*, --tenant-max-*)",
          count, String.join("; ", over), count > over.size() ? "; and " + (count - over.size()) + " more" : "");
    }
  }

  private static boolean exceeds(Quota quota, long[] usage) {
    return (quota.maxLeases() > 0 && usage[0] > quota.maxLeases())
        || (quota.maxLeasedBytes() > 0 && usage[1] > quota.maxLeasedBytes());
  }
}
