package io.gpumemd.server.session;

import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.server.books.Tenant;
import io.gpumemd.server.sharing.PublishedObject;
import io.gpumemd.server.sharing.ShareToken;
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.common.SizeClasses;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.session.SessionsSnapshot.ClientCounters;
import io.gpumemd.server.session.SessionsSnapshot.LeaseSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.ObjectSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.SessionSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.SharedBlockSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.TokenSnapshot;
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

/**
 * Rebuilds the registry's rooms from a {@link SessionsSnapshot} written in another process
 * ({@link SessionsSnapshotWriter}), over pools already restored from their own snapshots: every
 * block a lease names is there, LEASED or CLIENT_CACHED, and the pool's own books about it are
 * the pool's (nothing here calls the pool but {@link io.gpumemd.server.pool.DevicePool#blocksOf}).
 *
 * <p>What is carried and what is derived: sessions, records, shared blocks, tokens, names, the
 * lease sequence and the churn window are carried; each session's and tenant's quota usage,
 * session and share and hold counts are recounted from them; quotas, the TTL bound and the
 * client cache cap are this daemon's own configuration, applied without ever shrinking what is
 * leased (restored usage over a quota stays, and {@link SessionsSnapshot.Restored} names it).
 * Tenants' open-rate buckets and the reaper's scan throttles start afresh.
 *
 * <p>Build, then register: every object is built and every cross-reference checked ({@link
 * #build}) before anything enters the registry's maps ({@link #register}), so a snapshot that
 * does not fit throws {@link IllegalStateException} naming what is wrong, with nothing live
 * registered (tenant entries may have been created, empty; the caller discards the registry
 * anyway).
 *
 * <p>One instance per restore, on a registry that serves nothing yet; not thread-safe.
 */
final class SessionsRestorer {
  /** Over-quota sessions or tenants named in {@link SessionsSnapshot.Restored}; the rest are counted. */
  private static final int NAMED_IN_WARNING = 5;

  /** A segment of a device: where a restore looks a block up. */
  private record SegmentKey(int device, long segmentId) {}

  /** The registry's rooms, which this restore fills. */
  private final RegistryRooms rooms;

  // What build() makes, register() enters.
  private long now;
  private final Map<String, Session> byId = new LinkedHashMap<>();
  /** Each block is held by one lease or one shared block, never two. */
  private final Set<Block> places = Collections.newSetFromMap(new IdentityHashMap<>());
  /** The restored pools' blocks by offset, per segment, as far as looked up. */
  private final Map<SegmentKey, Map<Long, Block>> segmentBlocks = new HashMap<>();
  private final List<SharedBlock> blocks = new ArrayList<>();
  private final Map<String, LeaseRecord> records = new LinkedHashMap<>();
  private long lastSequence;
  private int[] tokenCounts;
  private final List<ShareToken> tokens = new ArrayList<>();
  private final List<Set<String>> namesOf = new ArrayList<>();
  private final List<PublishedObject> objects = new ArrayList<>();
  private int cappedTtls;
  private int cappedAllowances;

  SessionsRestorer(RegistryRooms rooms) {
    this.rooms = rooms;
  }

  /**
   * Rebuilds the registry from {@code state}; see the class javadoc for what is carried, what
   * is derived, and what a failure leaves.
   *
   * @throws IllegalStateException when the registry is not fresh, or the state does not fit
   *     the pools or itself (naming the lease, block, token or name)
   */
  SessionsSnapshot.Restored restore(SessionsSnapshot state) {
    LiveSessions sessions = rooms.sessions();
    LeaseBook book = rooms.book();
    SharedObjects sharing = rooms.sharing();
    if (sessions.size() != 0 || book.size() != 0 || sharing.tokenCount() != 0 || !sharing.allObjects().isEmpty()) {
      throw new IllegalStateException("take-over restore needs a fresh registry: this one has " + sessions.size()
          + " sessions, " + book.size() + " leases, " + sharing.tokenCount() + " share tokens");
    }
    now = rooms.ticker().nanos();
    build(state);
    register(state.churn());
    List<String> over = new ArrayList<>();
    int overCount = overQuota(over);
    return new SessionsSnapshot.Restored(byId.size(), records.size(), blocks.size(), tokens.size(), objects.size(),
        lastSequence, cappedTtls, cappedAllowances, overCount, over);
  }

  // ------------------------------------------------------------------------------ build

  /** Builds sessions, shared blocks, records, tokens and names; checks every reference. */
  private void build(SessionsSnapshot state) {
    for (SessionSnapshot s : state.sessions()) {
      Session session = session(s, now);
      if (byId.putIfAbsent(session.id(), session) != null) {
        throw new IllegalStateException("session " + s.id() + " twice in the take-over state");
      }
    }
    for (int i = 0; i < state.sharedBlocks().size(); i++) {
      SharedBlockSnapshot b = state.sharedBlocks().get(i);
      String what = "shared block " + i + " (leased by session " + b.leasedBySessionId() + ")";
      Block block = findBlock(what, b.device(), b.segmentId(), b.blockOffset(), b.blockSize(), null);
      claim(places, what, block);
      blocks.add(new SharedBlock(block, b.requestedBytes(), rooms.directory().tenant(b.leasedByTenant()),
          b.leasedBySessionId()));
    }
    lastSequence = state.leaseSequence();
    for (LeaseSnapshot l : state.leases()) {
      LeaseRecord r = record(l, byId, blocks, places, now);
      if (records.putIfAbsent(r.id(), r) != null) {
        throw new IllegalStateException("lease " + l.id() + " twice in the take-over state");
      }
      lastSequence = Math.max(lastSequence, r.sequence());
    }
    buildTokens(state.tokens());
    buildObjects(state.objects());
    checkSharedBlocks(state.sharedBlocks());
    for (LeaseRecord r : records.values()) {
      r.session().restoreRecord(r);
    }
  }

  private void buildTokens(List<TokenSnapshot> states) {
    tokenCounts = new int[blocks.size()];
    Set<String> tokenIds = new HashSet<>();
    for (TokenSnapshot t : states) {
      String what = "share token " + t.id();
      if (t.dead()) {
        throw new IllegalStateException(what + " was killed but not yet dropped: the state was not taken quiet");
      }
      if (!SecureIds.isWellFormed(t.token()) || !SecureIds.isWellFormed(t.id())
          || !tokenIds.add(t.token()) || !tokenIds.add(t.id())) {
        throw new IllegalStateException(what + ": malformed or repeated token or id");
      }
      int i = blockIndex(what, t.sharedBlock(), blocks);
      tokenCounts[i]++;
      tokens.add(new ShareToken(t.token(), t.id(), t.tenant(), t.sessionId(), t.clientName(), t.leaseId(),
          blocks.get(i), t.readOnly(), t.maxAttaches(), now - t.createdAgeNanos(), now + t.expiresInNanos(),
          t.attaches(), false));
    }
  }

  private void buildObjects(List<ObjectSnapshot> states) {
    blocks.forEach(b -> namesOf.add(new TreeSet<>()));
    Set<String> keys = new HashSet<>();
    for (ObjectSnapshot o : states) {
      String what = "object '" + o.name() + "' of tenant " + o.tenant();
      if (!keys.add(PublishedObject.key(o.tenant(), o.name()))) {
        throw new IllegalStateException(what + " twice in the take-over state");
      }
      int i = blockIndex(what, o.sharedBlock(), blocks);
      namesOf.get(i).add(o.name());
      objects.add(new PublishedObject(o.tenant(), o.name(), blocks.get(i), o.readOnly(),
          now - o.publishedAgeNanos(), o.publishedBy(), new AtomicLong(o.lookups())));
    }
  }

  /** Gives each shared block its holds and checks them against what names it. */
  private void checkSharedBlocks(List<SharedBlockSnapshot> states) {
    Map<SharedBlock, Integer> recordsNaming = new IdentityHashMap<>();
    records.values().stream().filter(r -> r.shared() != null)
        .forEach(r -> recordsNaming.merge(r.shared(), 1, Integer::sum));
    for (int i = 0; i < blocks.size(); i++) {
      SharedBlock b = blocks.get(i);
      holdsOf(i, states.get(i), b, records, tokenCounts[i], namesOf.get(i));
      // Every id it lists names it (holdsOf): equal counts mean it lists every record naming it.
      int listed = b.snapshot().records().size();
      if (listed != recordsNaming.getOrDefault(b, 0)) {
        throw new IllegalStateException("shared block " + i + " lists " + listed + " leases and holds, but "
            + recordsNaming.getOrDefault(b, 0) + " name it");
      }
    }
  }

  /** A session as written down, not yet live: detached, its grace (if it had a stream) from now. */
  private Session session(SessionSnapshot s, long now) {
    if (!SecureIds.isWellFormed(s.id())) {
      throw new IllegalStateException("session id '" + s.id() + "' in the take-over state is malformed");
    }
    try {
      return buildSession(s, now);
    } catch (IllegalArgumentException e) {
      throw new IllegalStateException("session " + s.id() + " in the take-over state: " + e.getMessage(), e);
    }
  }

  private Session buildSession(SessionSnapshot s, long now) {
    Caller caller = s.owner();
    if (caller.equals(Caller.DAEMON)) {
      caller = Caller.DAEMON; // Caller#owns knows the daemon by identity
    }
    int ttl = s.ttlSeconds() <= 0 ? rooms.settings().defaultTtlSeconds() : Math.min(s.ttlSeconds(),
        rooms.settings().maxTtlSeconds());
    if (ttl != s.ttlSeconds()) {
      cappedTtls++;
    }
    long cap = rooms.settings().clientCacheBytes();
    long granted = Math.min(s.grantedCacheBytes(), cap);
    long allowance = Math.min(s.cacheAllowance(), cap);
    if (granted != s.grantedCacheBytes()) {
      cappedAllowances++;
    }
    Session session = new Session(s.id(), caller, rooms.directory().tenant(caller.tenant()),
        new SegmentOwner(s.segmentOwnerKey(), s.segmentOwnerUid(), s.segmentOwnerGid()), s.clientName(), ttl,
        rooms.settings().quotaFor(s.clientName()), granted, now - s.openedAgeNanos());
    Map<Integer, long[]> counters = new HashMap<>();
    for (ClientCounters rc : s.reportedCounters()) {
      counters.put(rc.device(), new long[] {Math.max(0, rc.hits()), Math.max(0, rc.returns())});
    }
    // Every session comes back detached. One that had a stream gets its whole grace from now, so
    // that its client, told to move or cut off by the move, reattaches in time; one that never
    // had one keeps the TTL it had left.
    session.restoreState(now - s.lastSeenAgeNanos(), s.hadStream(), now, allowance,
        s.cacheReturnOverdue(), counters, s.appliedMessages());
    return session;
  }

  private LeaseRecord record(LeaseSnapshot l, Map<String, Session> byId, List<SharedBlock> blocks, Set<Block> places,
      long now) {
    // Named as text only in a refusal: 10,000 leases are restored inside the take-over's pause.
    Object what = new LeaseName(l.id());
    if (!SecureIds.isWellFormed(l.id())) {
      throw new IllegalStateException(what + ": malformed id in the take-over state");
    }
    Session session = byId.get(l.sessionId());
    if (session == null) {
      throw new IllegalStateException(what + " names session " + l.sessionId() + ", which is not in the state");
    }
    SharedBlock shared = l.sharedBlock() < 0 ? null : blocks.get(blockIndex(what, l.sharedBlock(), blocks));
    if (l.attached() && shared == null) {
      throw new IllegalStateException(what + " is a hold but names no shared block");
    }
    String expected = l.clientCached() ? "CLIENT_CACHED" : "LEASED";
    Block block = findBlock(what, l.device(), l.segmentId(), l.blockOffset(), l.blockSize(), expected);
    if (shared == null) {
      claim(places, what, block);
    } else if (shared.block() != block) {
      throw new IllegalStateException(what + " is on block " + block + " but its shared block is " + shared.block());
    }
    return new LeaseRecord(l.id(), session, block, l.requestedBytes(), l.tag(), now - l.grantedAgeNanos(),
        l.sequence(), l.poolHit(), l.attached(), l.readOnly(), shared, l.clientCached(),
        l.leakReported());
  }

  // --------------------------------------------------------------------------- register

  /** Enters what {@link #build} made; nothing here can fail on a state that passed its checks. */
  private void register(SessionsSnapshot.Churn c) {
    for (Session s : byId.values()) {
      rooms.sessions().restore(s);
      s.tenantUsage().addSession(0);
    }
    for (LeaseRecord r : records.values()) {
      Tenant tenant = r.session().tenantUsage();
      if (r.attached()) {
        tenant.reserveHold(0, null);
      } else if (r.shared() == null) {
        tenant.reserve(SizeClasses.roundUp(r.sizeBytes()), 0, Quota.UNLIMITED, null);
      }
    }
    for (SharedBlock b : blocks) {
      // A shared block's bytes stay its leasing tenant's until its last hold goes (LeaseBook#giveBack).
      b.leasedBy().reserve(SizeClasses.roundUp(b.sizeBytes()), 0, Quota.UNLIMITED, null);
    }
    tokens.forEach(t -> rooms.directory().tenant(t.tenant()).addShare(0));
    objects.forEach(o -> rooms.directory().tenant(o.tenant()).addShare(0));
    rooms.book().restore(records.values(), lastSequence);
    rooms.sharing().restore(tokens, objects);
    rooms.churn().restore(new long[] {now - c.windowAgeNanos(), c.opened(), c.ended(), c.endedHolding(),
        c.releasedLeases(), c.releasedBytes(), c.refusedTotal(), c.refusedPerTenant(), c.refusedRate(),
        c.holdingToldSingly()});
  }

  /**
   * The block a lease or shared block names, found in the restored pool.
   *
   * @param expected the state it must be in, or null for either leased state
   */
  private Block findBlock(Object what, int device, long segmentId, long offset, long size, String expected) {
    if (device < 0 || device >= rooms.pools().all().size()) {
      throw new IllegalStateException(what + " is on device " + device + ", which this daemon does not have");
    }
    // One walk per segment, not one per lease: 10,000 leases in a few segments made a walk per
    // lease the largest part of the restore, inside the take-over's pause.
    Block block = segmentBlocks.computeIfAbsent(new SegmentKey(device, segmentId),
        k -> rooms.pools().get(device).blocksOf(segmentId)).get(offset);
    if (block == null) {
      throw new IllegalStateException(what + ": the restored pool has no block at " + where(device, segmentId, offset));
    }
    String found = state(block);
    boolean held = found.equals("LEASED") || found.equals("CLIENT_CACHED");
    if (!held || (expected != null && !expected.equals(found))) {
      throw new IllegalStateException(what + ": the block at " + where(device, segmentId, offset) + " is " + found
          + " in the restored pool, expected " + (expected == null ? "LEASED or CLIENT_CACHED" : expected));
    }
    if (block.size() != size) {
      throw new IllegalStateException(what + ": the block at " + where(device, segmentId, offset) + " has "
          + block.size() + " bytes in the restored pool, " + size + " in the state");
    }
    return block;
  }

  private static String where(int device, long segmentId, long offset) {
    return "device " + device + ", segment " + segmentId + ", offset " + offset;
  }

  /** How a refusal names a lease. */
  private record LeaseName(String id) {
    @Override
    public String toString() {
      return "lease " + id;
    }
  }

  /** A block's state as the pool says it (the pool is quiet during a restore). */
  private static String state(Block block) {
    return block.stateName();
  }

  /** Each block is held by one lease or one shared block, never two. */
  private static void claim(Set<Block> places, Object what, Block block) {
    if (!places.add(block)) {
      throw new IllegalStateException(what + ": block " + block + " is named twice in the take-over state");
    }
  }

  private static int blockIndex(Object what, int index, List<SharedBlock> blocks) {
    if (index < 0 || index >= blocks.size()) {
      throw new IllegalStateException(what + " names shared block " + index + " of " + blocks.size());
    }
    return index;
  }

  /** Adds a shared block's holds and checks them against the records, tokens and names naming it. */
  private static void holdsOf(int i, SharedBlockSnapshot state, SharedBlock shared, Map<String, LeaseRecord> records,
      int tokens, Set<String> names) {
    String what = "shared block " + i + " (segment " + state.segmentId() + ", offset " + state.blockOffset()
        + ")";
    for (String id : state.recordIds()) {
      LeaseRecord r = records.get(id);
      if (r == null || r.shared() != shared) {
        throw new IllegalStateException(what + " lists lease " + id + ", which is not a lease or hold on it");
      }
      shared.addRecord(r);
    }
    if (state.tokenCount() != tokens) {
      throw new IllegalStateException(what + " counts " + state.tokenCount() + " share tokens, " + tokens
          + " tokens name it");
    }
    if (!new TreeSet<>(state.names()).equals(names)) {
      throw new IllegalStateException(what + " has names " + state.names() + ", the objects naming it are "
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

  /**
   * Counts the restored sessions and tenants whose usage is over this daemon's quotas (it stays,
   * new leases are refused), naming the first few in {@code named}.
   */
  private int overQuota(List<String> named) {
    int count = 0;
    Set<Tenant> tenants = Collections.newSetFromMap(new IdentityHashMap<>());
    for (Session s : byId.values()) {
      long[] usage = s.quotaUsage();
      if (exceeds(s.quota(), usage)) {
        if (count++ < NAMED_IN_WARNING) {
          named.add(s + ": " + usage[0] + " leases, " + usage[1] + " bytes");
        }
      }
      tenants.add(s.tenantUsage());
    }
    for (Tenant t : tenants) {
      long[] usage = t.holdings();
      if (exceeds(rooms.settings().tenantQuota(), usage)) {
        if (count++ < NAMED_IN_WARNING) {
          named.add("tenant " + t.key() + ": " + usage[0] + " leases, " + usage[1] + " bytes");
        }
      }
    }
    return count;
  }

  private static boolean exceeds(Quota quota, long[] usage) {
    return (quota.maxLeases() > 0 && usage[0] > quota.maxLeases())
        || (quota.maxLeasedBytes() > 0 && usage[1] > quota.maxLeasedBytes());
  }
}
