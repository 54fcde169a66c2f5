package io.gpumemd.server.sharing;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.books.LeaseHolder;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Page;
import io.gpumemd.server.books.Reservation;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.server.books.Tenant;
import io.gpumemd.server.books.Validation;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.error.PermissionDeniedException;
import io.gpumemd.server.offload.HostStore;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Share tokens and published names: the two ways a leased block reaches other sessions of its
 * tenant. Both are holds on the block ({@link SharedBlock}) that outlive the session that made
 * them: a token until it expires, is revoked or is used up, a name until it is unpublished. A
 * session that attaches (by token) or looks up (by name) gets a hold of its own, a record the
 * {@link LeaseBook} keeps with its leases and drops when it releases or ends.
 *
 * <p>Rules: tokens and names are visible to their tenant only; another tenant's answers
 * exactly like an unknown one (NOT_FOUND), because a segment handle opens the whole segment
 * and segments never cross tenants. A failed call changes nothing. Each tenant has at most
 * {@code --max-shares-per-tenant} live tokens plus names; published bytes are bounded per
 * device by the pool. Token lives are bounded by {@code --share-max-seconds}.
 *
 * <p>Operators: an admin lists every tenant's tokens ({@link #shares}: metadata and the public
 * id, never the token) and objects, and revokes or removes any of them ({@link #removeShare},
 * {@link #remove}), logged at INFO with who asked; anyone else reaches its own tenant's only,
 * and naming another tenant is PERMISSION_DENIED whether or not the id exists.
 *
 * <p>Thread-safety: tokens and names live in concurrent maps; which caller kills a token or
 * removes a name (and drops its hold) is decided by an atomic remove, so each hold is dropped
 * exactly once. {@link #expire} runs on the housekeeping thread.
 */
public final class SharedObjects {
  private static final Logger log = LoggerFactory.getLogger(SharedObjects.class);

  private final HolderDirectory directory;
  private final LeaseBook book;
  private final DevicePools pools;
  private final SharingSettings settings;
  private final Ticker ticker;
  private final ObjectParking parking;
  private final TokenTable tokens;
  private final ConcurrentHashMap<String, PublishedObject> objects = new ConcurrentHashMap<>();

  /** @param store where parked objects' contents go ({@code --offload-max-bytes}) */
  public SharedObjects(HolderDirectory directory, LeaseBook book, DevicePools pools, SharingSettings settings,
      Ticker ticker, HostStore store) {
    this.directory = directory;
    this.book = book;
    this.pools = pools;
    this.settings = settings;
    this.ticker = ticker;
    this.parking = new ObjectParking(directory, book, pools, store);
    this.tokens = new TokenTable(directory, book);
  }

  public SharingSettings settings() {
    return settings;
  }

  /**
   * Gives a session of the caller's tenant its own hold on a shared block (Attach, Lookup),
   * within the session's and the tenant's bounds on holds. The daemon's own caller is no peer:
   * it takes the session bound only (as in {@code SessionLimits}).
   *
   * @throws NotFoundException when the session ended or the block went back meanwhile
   * @throws ExhaustedException at a bound, having taken nothing
   */
  private LeaseRecord hold(Caller caller, String sessionId, SharedBlock shared, boolean readOnly, String tag) {
    directory.checkNotDraining();
    LeaseHolder session = directory.session(caller, sessionId);
    Validation.label("tag", tag);
    try (Reservation place = Reservation.forHold(session, settings.maxHoldsPerSession(),
        caller == Caller.DAEMON ? 0 : settings.maxHoldsPerTenant())) {
      return book.hold(place, shared, readOnly, tag);
    }
  }

  /** What {@link #share} made: the token, the seconds it is valid, and its public id. */
  public record Share(String token, int expiresAfterSeconds, String id) {}

  /**
   * Makes a share token for a lease or hold of a session of the caller's tenant. A token of a
   * read-only hold is read-only too: a holder cannot grant more than it has.
   */
  public Share share(Caller caller, String sessionId, String leaseId, int expiresAfterSeconds, boolean readOnly,
      int maxAttaches) {
    directory.checkNotDraining();
    LeaseHolder session = directory.session(caller, sessionId);
    LeaseRecord lease = book.find(session, leaseId);
    if (expiresAfterSeconds < 0) {
      throw InvalidRequestException.of("expires_after_seconds", expiresAfterSeconds, ">= 0");
    }
    if (maxAttaches < 0) {
      throw InvalidRequestException.of("max_attaches", maxAttaches, ">= 0");
    }
    int seconds = settings.grantSeconds(expiresAfterSeconds);
    Tenant tenant = session.tenantUsage();
    takeShareSlot(tenant, session.tenant());
    SharedBlock shared;
    try {
      shared = shareable(session, lease);
      if (!shared.addToken()) {
        throw Refusals.released(leaseId);
      }
    } catch (RuntimeException e) {
      tenant.removeShare();
      throw e;
    }
    long now = ticker.nanos();
    ShareToken token = new ShareToken(SecureIds.next(), SecureIds.next(), session, lease, shared,
        readOnly || lease.readOnly(), maxAttaches, now, now + TimeUnit.SECONDS.toNanos(seconds));
    tokens.add(token);
    pools.get(shared.block().device()).shareMade();
    log.atDebug().addKeyValue("session", session.id()).addKeyValue("lease", lease.id())
        .log("{}: lease {} shared for {} s ({} attaches{})", session, lease.id(), seconds,
        maxAttaches == 0 ? "any number of" : "at most " + maxAttaches, token.readOnly ? ", read-only" : "");
    return new Share(token.token, seconds, token.id);
  }

  /**
   * Revokes a token of the caller's tenant: its own hold ends, holds taken with it stay.
   *
   * @return true when that was the block's last hold and it went back to the pool
   */
  public boolean revoke(Caller caller, String sessionId, String token) {
    directory.session(caller, sessionId);
    SecureIds.checkSecret("token", token);
    ShareToken found = tokens.get(token);
    if (found == null || !caller.owns(found.tenant) || !found.kill()) {
      throw Refusals.tokenNotFound();
    }
    return retire(found);
  }

  /** Attaches a session of the caller's tenant to a token's block: a hold of its own. */
  public LeaseRecord attach(Caller caller, String sessionId, String token, String tag) {
    Validation.label("tag", tag);
    SecureIds.checkSecret("token", token);
    ShareToken found = tokens.get(token);
    if (found == null || !caller.owns(found.tenant) || found.expired(ticker.nanos())) {
      directory.session(caller, sessionId); // an unknown session says so first
      throw Refusals.tokenNotFound();
    }
    LeaseRecord hold = hold(caller, sessionId, found.shared, found.readOnly, tag);
    int use = found.use();
    if (use < 0) {
      // Used up or revoked while we took the hold: undo it, the token is gone.
      book.release(hold.session(), hold.id(), new byte[0]);
      throw Refusals.tokenNotFound();
    }
    if (use == 1) {
      retire(found); // one-shot: the token's hold passed to ours
    }
    return hold;
  }

  /** Publishes a lease or hold of a session under a name of its tenant. */
  public void publish(Caller caller, String sessionId, String leaseId, String name, boolean readOnly) {
    directory.checkNotDraining();
    LeaseHolder session = directory.session(caller, sessionId);
    LeaseRecord lease = book.find(session, leaseId);
    PublishedObject.checkName(name);
    String key = PublishedObject.key(session.tenant(), name);
    if (objects.containsKey(key)) {
      throw Refusals.exists(name);
    }
    Tenant tenant = session.tenantUsage();
    takeShareSlot(tenant, session.tenant());
    SharedBlock shared;
    try {
      shared = shareable(session, lease);
    } catch (RuntimeException e) {
      tenant.removeShare();
      throw e;
    }
    DevicePool pool = pools.get(shared.block().device());
    // The name and the pool's published figures change together, under the block's monitor:
    // a concurrent drop of the block's last name then counts its bytes out before this counts
    // them in (never twice at once), and no other name can come between a refused first name
    // and its undoing. (Lock order: block monitor, then pool lock; the pool never takes the
    // former.)
    int namesBefore;
    SharedBlock.NameDrop refused = null;
    synchronized (shared) {
      namesBefore = shared.addName(name);
      if (namesBefore == 0 && !pool.publish(shared.block())) {
        refused = shared.dropName(name);
      } else if (namesBefore > 0) {
        pool.publishedAgain();
      }
    }
    if (namesBefore < 0) {
      tenant.removeShare();
      // The block went back, or a concurrent publish of this very name on it won the race.
      throw shared.returned() ? Refusals.released(leaseId) : Refusals.exists(name);
    }
    if (refused != null) {
      if (refused.lastHold()) {
        book.giveBack(shared);
      }
      tenant.removeShare();
      throw Refusals.overPublishedLimit(pool, shared.block().size());
    }
    PublishedObject object = new PublishedObject(session.tenant(), name, shared, readOnly || lease.readOnly(),
        ticker.nanos(), "'" + session.clientName() + "' (session " + session.id().substring(0, 8) + ")",
        new AtomicLong());
    if (objects.putIfAbsent(key, object) != null) {
      parking.dropName(shared, name);
      tenant.removeShare();
      throw Refusals.exists(name);
    }
    shared.used(object.publishedNanos());
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("object", name)
        .log("{} published '{}' of tenant {}: {} bytes on device {}{}", session, name, session.tenant(),
        shared.block().size(), shared.block().device(), object.readOnly() ? ", read-only" : "");
  }

  /**
   * Attaches a session of the caller's tenant to a published object: a hold of its own. A parked
   * object is restored first, into a new block; a hold refused after that leaves it restored.
   */
  public LeaseRecord lookup(Caller caller, String sessionId, String name, String tag) {
    Validation.label("tag", tag);
    PublishedObject.checkName(name);
    PublishedObject object = objects.get(PublishedObject.key(caller.tenant(), name));
    if (object == null) {
      directory.session(caller, sessionId);
      throw Refusals.objectNotFound(name);
    }
    LeaseRecord hold = parking.restoreAndHold(object, caller, sessionId,
        () -> hold(caller, sessionId, object.shared(), object.readOnly(), tag));
    object.lookups().incrementAndGet();
    object.shared().used(ticker.nanos());
    return hold;
  }

  /**
   * Parks a published object that only its names hold (Admin.ParkObject): the caller's own
   * tenant's, or any tenant's for an admin. See {@link ObjectParking#park}.
   *
   * @param tenant the object's tenant; empty for the caller's own
   */
  public ObjectParking.Parked park(Caller caller, String tenant, String name) {
    return parking.parkLocked(adminTarget(caller, tenant, name, "parking another tenant's object"),
        caller.toString());
  }

  /**
   * From now on a lease refused for lack of budget first parks idle objects of its device, least
   * recently looked up first ({@code --park-idle-objects}): the pools' {@link
   * io.gpumemd.server.pool.BudgetRelief}.
   */
  public void parkIdleObjectsWhenShort() {
    pools.all().forEach(p -> p.sleep().budgetRelief((device, bytes) -> parking.parkIdle(objects.values(), device,
        bytes)));
  }

  /**
   * Published objects parked now, and tokens and names left holding nothing by a lease released
   * asleep, as refusals name them (take-over: none of them has a block to hand over).
   */
  public List<String> parkedObjects() {
    List<String> out = new ArrayList<>(ObjectParking.parked(objects.values()));
    tokens.all().stream().filter(t -> t.shared.orphaned()).sorted(TOKEN_ORDER).forEach(t -> out.add("share token "
        + t.id + " of tenant " + t.tenant + " (its lease was released while asleep: revoke it)"));
    return out;
  }

  /**
   * Removes a published name of the session's tenant.
   *
   * @return true when the name was the block's last hold and it went back to the pool
   */
  public boolean unpublish(Caller caller, String sessionId, String name) {
    LeaseHolder session = directory.session(caller, sessionId);
    PublishedObject.checkName(name);
    PublishedObject object = objects.remove(PublishedObject.key(session.tenant(), name));
    if (object == null) {
      throw Refusals.objectNotFound(name);
    }
    log.atInfo().addKeyValue("session", session.id()).addKeyValue("object", name)
        .log("{} unpublished '{}' of tenant {}", session, name, object.tenant());
    return retire(object);
  }

  /**
   * Removes a published name without a session: the caller's own tenant's, or any tenant's for
   * an admin (logged with who asked).
   *
   * @param tenant the object's tenant; empty for the caller's own
   */
  public boolean remove(Caller caller, String tenant, String name) {
    PublishedObject found = adminTarget(caller, tenant, name, "removing another tenant's object");
    if (!objects.remove(PublishedObject.key(found.tenant(), name), found)) {
      throw Refusals.objectNotFound(name);
    }
    log.atInfo().addKeyValue("object", name).addKeyValue("admin", caller.principal())
        .log("Object '{}' of tenant {} removed by {}", name, found.tenant(), caller);
    return retire(found);
  }

  /** An object an admin verb names: the caller's own tenant's, or any tenant's for an admin. */
  private PublishedObject adminTarget(Caller caller, String tenant, String name, String what) {
    String owner = tenant.isEmpty() ? caller.tenant() : tenant;
    PublishedObject.checkName(name);
    if (!caller.owns(owner) && !caller.admin()) {
      throw Refusals.notAdmin(what, caller);
    }
    PublishedObject object = objects.get(PublishedObject.key(owner, name));
    if (object == null) {
      throw Refusals.objectNotFound(name);
    }
    return object;
  }

  /** Published objects the caller may see (its tenant's; every one for an admin), a page at a time. */
  public Page<PublishedObject> objects(Caller caller, String afterTenant, String afterName, int size) {
    return Page.select(objects.values(), o -> caller.admin() || caller.owns(o.tenant()),
        o -> afterTenant == null || OBJECT_ORDER.compare(o, probe(afterTenant, afterName)) > 0, OBJECT_ORDER, size);
  }

  /** Objects by tenant, then name: the order of {@link #objects}. */
  public static final Comparator<PublishedObject> OBJECT_ORDER =
      Comparator.comparing(PublishedObject::tenant).thenComparing(PublishedObject::name);

  private static PublishedObject probe(String tenant, String name) {
    return new PublishedObject(tenant, name, null, false, 0, "", null);
  }

  /**
   * Live share tokens the caller may see, by tenant, then age, then id, a page at a time: every
   * tenant's for an admin, else the caller's own tenant's.
   *
   * @param tenant only this tenant's (empty: all the caller may see); another tenant's needs
   *     an admin
   * @param after the last token of the previous page; null for the first page
   * @throws PermissionDeniedException for a non-admin naming another tenant
   */
  public Page<ShareToken> shares(Caller caller, String tenant, ShareCursor after, int size) {
    if (!tenant.isEmpty() && !caller.owns(tenant) && !caller.admin()) {
      throw Refusals.notAdmin("listing another tenant's share tokens", caller);
    }
    long now = ticker.nanos();
    return Page.select(tokens.all(),
        t -> (caller.admin() || caller.owns(t.tenant)) && (tenant.isEmpty() || t.tenant.equals(tenant))
            && !t.expired(now),
        t -> after == null || after.isBefore(t), TOKEN_ORDER, size);
  }

  /** Tokens by tenant, then age, then id: the order of {@link #shares}. */
  public static final Comparator<ShareToken> TOKEN_ORDER = Comparator.comparing(ShareToken::tenant)
      .thenComparingLong(ShareToken::createdNanos).thenComparing(ShareToken::id);

  /**
   * Revokes a share token by its public id, without a session: the caller's own tenant's, or
   * any tenant's for an admin. As {@link #revoke}, its own hold ends and holds taken with it
   * stay. Logged at INFO with who asked.
   *
   * @param tenant the token's tenant; empty for the caller's own
   * @return true when that was the block's last hold and it went back to the pool
   * @throws PermissionDeniedException for a non-admin naming another tenant, whether or not
   *     the id exists there
   */
  public boolean removeShare(Caller caller, String tenant, String shareId) {
    String owner = tenant.isEmpty() ? caller.tenant() : tenant;
    // Not echoed: a token pasted here by mistake is a secret.
    SecureIds.checkSecret("share_id", shareId);
    if (!caller.owns(owner) && !caller.admin()) {
      throw Refusals.notAdmin("revoking another tenant's share token", caller);
    }
    ShareToken found = tokens.byId(shareId);
    if (found == null || !found.tenant.equals(owner) || !found.kill()) {
      // The id is not echoed either: a well-formed one may still be a token pasted by mistake.
      throw new NotFoundException("share token of tenant " + owner + " not found by that share_id (unknown, "
          + "expired, revoked or used up)");
    }
    boolean returned = retire(found);
    log.atInfo().addKeyValue("share", shareId).addKeyValue("admin", caller.principal())
        .log("Share token {} of tenant {} (made by session {} for lease {}) revoked by {}{}", shareId, owner,
        found.sessionId().substring(0, 8), found.leaseId(), caller, returned ? "; its block went back" : "");
    return returned;
  }

  /** Live share tokens (all tenants). */
  public int tokenCount() {
    return tokens.size();
  }

  /** The blocks live tokens and names hold, one entry per token or name (for invariant checks). */
  public List<SharedBlock> heldByTokensAndNames() {
    List<SharedBlock> out = new ArrayList<>();
    tokens.all().forEach(t -> out.add(t.shared));
    objects.values().forEach(o -> out.add(o.shared()));
    return out;
  }

  /** Every live token, in no order (snapshot). */
  public Collection<ShareToken> allTokens() {
    return tokens.all();
  }

  /** Every published object, in no order (snapshot). */
  public Collection<PublishedObject> allObjects() {
    return objects.values();
  }

  /**
   * Enters the tokens and names of a snapshot into empty tables (a
   * restore). Their blocks already count them as holds; their tenants' share counts are the
   * caller's.
   *
   * @throws IllegalStateException when the tables are not empty, or a token or name repeats
   */
  public void restore(List<ShareToken> restoredTokens, List<PublishedObject> restoredObjects) {
    if (tokens.size() > 0 || !objects.isEmpty()) {
      throw new IllegalStateException("sharing tables already in use: " + tokens.size() + " tokens, "
          + objects.size() + " names");
    }
    tokens.restore(restoredTokens);
    for (PublishedObject o : restoredObjects) {
      if (objects.putIfAbsent(PublishedObject.key(o.tenant(), o.name()), o) != null) {
        throw new IllegalStateException("object '" + o.name() + "' of tenant " + o.tenant()
            + " twice in the take-over state");
      }
    }
  }

  /** Ends expired tokens' holds; at most once a second (a scan is O(tokens)). */
  public void expire(long nowNanos) {
    tokens.expire(nowNanos);
  }

  /** Drops every token and name (shutdown: the daemon frees everything anyway). */
  public void dropAll(String reason) {
    int names = objects.size();
    tokens.dropAll();
    for (PublishedObject object : objects.values()) {
      if (objects.remove(PublishedObject.key(object.tenant(), object.name()), object)) {
        retire(object);
      }
    }
    if (names > 0) {
      log.info("Dropped {} published objects: {}", names, reason);
    }
  }

  // ------------------------------------------------------------------------------ internals

  private SharedBlock shareable(LeaseHolder session, LeaseRecord lease) {
    DevicePool pool = pools.get(lease.block().device());
    SharedBlock shared = session.shareable(lease, () -> pool.blockShared(lease.block()));
    if (shared == null) {
      throw Refusals.released(lease.id());
    }
    return shared;
  }

  private void takeShareSlot(Tenant tenant, String tenantKey) {
    int max = settings.maxSharesPerTenant();
    if (!tenant.addShare(max)) {
      throw Refusals.sharesAtBound(tenantKey, max);
    }
  }

  private boolean retire(ShareToken token) {
    return tokens.retire(token);
  }

  /** Drops a removed name's hold (the caller removed it from the table). */
  private boolean retire(PublishedObject object) {
    directory.tenant(object.tenant()).removeShare();
    return parking.dropName(object.shared(), object.name());
  }
}
