package io.gpumemd.server.sharing;

import io.gpumemd.common.Sizes;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.books.LeaseHolder;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.offload.HostStore;
import io.gpumemd.server.offload.ParkedRange;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.Comparator;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Parking of published objects (issue 35 item 3; the design is in {@code
 * offload/package-info.java}): a block that only its names hold goes to the {@link HostStore},
 * its memory back to the pool; the next Lookup restores it into a new block before it holds it;
 * dropping the last name of a parked block drops its contents.
 *
 * <p>Pool figures: a parked block is no shared block and its names no published bytes (they
 * hold no device memory); restoring counts them in again, within {@code --max-published-bytes}.
 * The leasing tenant's quota keeps carrying the block while parked, as a sleeping session's
 * leases keep theirs, so a restore never fails for quota.
 *
 * <p>Thread-safety: every park, restore and drop of a parked block's last name runs under the
 * block's {@link SharedBlock#residency()} lock (taken here, or by the caller where a method says
 * so), which orders them for one block and is held across the copies; the block's monitor is
 * taken only for short state changes, and the pool's lock after it (the lock order of {@link
 * SharedBlock}). {@link #parkIdle} only tries the lock: it runs inside a lease. Stateless
 * otherwise.
 */
public final class ObjectParking {
  private static final Logger log = LoggerFactory.getLogger(ObjectParking.class);

  private final HolderDirectory directory;
  private final LeaseBook book;
  private final DevicePools pools;
  private final HostStore store;

  ObjectParking(HolderDirectory directory, LeaseBook book, DevicePools pools, HostStore store) {
    this.directory = directory;
    this.book = book;
    this.pools = pools;
    this.store = store;
  }

  /** What a park did: the object's bytes in host memory, and the device bytes freed (0 if parked already). */
  public record Parked(long hostBytes, long freedBytes) {}

  /**
   * Parks an object under its residency lock: see {@link #park(PublishedObject, String)}.
   *
   * @param who who asked, for the log line
   */
  Parked parkLocked(PublishedObject object, String who) {
    SharedBlock shared = object.shared();
    shared.residency().lock();
    try {
      long freed = park(object, who);
      return new Parked(shared.block().size(), freed);
    } finally {
      shared.residency().unlock();
    }
  }

  /**
   * A Lookup's hold on an object, taken once a parked object is restored for the looking
   * session. The residency lock is held across both, so that no park comes between them and
   * concurrent lookups of a parked object restore it once; a hold refused after a restore leaves
   * the object restored.
   */
  LeaseRecord restoreAndHold(PublishedObject object, Caller caller, String sessionId, Supplier<LeaseRecord> hold) {
    SharedBlock shared = object.shared();
    // A block that sleeps with its lease refuses, naming the very name looked up (the hold
    // would refuse too, naming the block's first name).
    String asleep = shared.sleepRefusal("object '" + object.name() + "'");
    if (asleep != null) {
      directory.session(caller, sessionId); // an unknown session says so first
      throw new ConflictException(asleep);
    }
    shared.residency().lock();
    try {
      if (shared.parked()) {
        directory.checkNotDraining();
        LeaseHolder session = directory.session(caller, sessionId);
        restoreIfParked(object, session.id(), directory.segmentOwner(session), session.toString());
      }
      return hold.get();
    } finally {
      shared.residency().unlock();
    }
  }

  /**
   * Drops a removed name's hold on its block. The pool counts the name out before the block can
   * go back (another holder's release may return it as soon as the name is dropped, and a
   * returned block's size may change as the pool merges it), and in order with a concurrent
   * first name ({@link SharedObjects#publish}); a parked block's names were counted out when it
   * was parked, and its last name drops its contents instead of giving a block back.
   *
   * @return true when that was the block's last hold
   */
  boolean dropName(SharedBlock shared, String name) {
    DevicePool pool = pools.get(shared.block().device());
    SharedBlock.NameDrop drop;
    shared.residency().lock();
    try {
      boolean parked;
      synchronized (shared) {
        drop = shared.dropName(name);
        parked = shared.parked();
        if (shared.asleep()) {
          // It sleeps with its lease (or its lease was released asleep): its names were counted
          // out at the sleep, their room kept for the wake.
          pool.sleep().unpublishedAsleep(shared.block().size(), drop.lastName());
        } else if (!parked) {
          pool.unpublished(shared.block(), drop.lastName());
        }
      }
      if (parked && drop.lastHold()) {
        shared.dropParked();
        return true;
      }
    } finally {
      shared.residency().unlock();
    }
    if (drop.lastHold()) {
      book.giveBack(shared);
    }
    return drop.lastHold();
  }

  /** Objects parked now, as refusals name them. */
  static List<String> parked(Collection<PublishedObject> objects) {
    List<String> out = new ArrayList<>();
    objects.stream().filter(o -> o.shared().parked() || o.shared().orphaned()).sorted(SharedObjects.OBJECT_ORDER)
        .forEach(o -> out.add("'" + o.name() + "' of tenant " + o.tenant()
            + (o.shared().orphaned() ? " (its lease was released while asleep: unpublish it)" : "")));
    return out;
  }

  /** The bound and figures of parked contents. */
  HostStore store() {
    return store;
  }

  /**
   * Parks a block that only its names hold.
   *
   * @param who who asked, for the refusal and the log line
   * @return device bytes freed (0 when it was parked already)
   * @throws ConflictException when someone else holds it, or GPU work of a former holder is
   *     still pending on it; nothing changed
   * @throws io.gpumemd.server.error.ExhaustedException over {@code --offload-max-bytes};
   *     nothing changed
   */
  long park(PublishedObject object, String who) {
    SharedBlock shared = object.shared();
    assert shared.residency().isHeldByCurrentThread();
    if (shared.parked()) {
      return 0;
    }
    String refusal = shared.parkRefusal();
    if (refusal != null) {
      throw new ConflictException(describe(object) + " cannot be parked: " + refusal);
    }
    for (CompletionEvent event : shared.keptEvents()) {
      if (!event.isComplete()) {
        throw new ConflictException(describe(object) + " cannot be parked yet: GPU work of a holder that released "
            + "it has not completed; try again");
      }
    }
    Block block = shared.block();
    // Read now: once freed, the pool may merge the block with its free neighbours.
    long bytes = block.size();
    int device = block.device();
    ParkedRange contents;
    try (HostStore.Claim claim = store.claim(bytes, describe(object))) {
      contents = claim.park(block.memory(), block.offset(), bytes);
    }
    DevicePool pool = pools.get(device);
    List<String> names;
    synchronized (shared) {
      shared.park(contents);
      names = shared.names();
      for (int i = 0; i < names.size(); i++) {
        pool.unpublished(block, i == names.size() - 1);
      }
    }
    pool.sharedBlockReturned();
    shared.freed(pool.sleep().park(block));
    shared.closeKeptEvents();
    log.atInfo().addKeyValue("object", object.name()).addKeyValue("bytes", bytes)
        .log("{} of tenant {} parked by {}: {} to host memory, device {} freed them ({} held in host memory in all)",
        describeNames(names), object.tenant(), who, Sizes.format(bytes), device, Sizes.format(store.heldBytes()));
    return bytes;
  }

  /**
   * Restores a parked block into a new one leased for the looking session's owner, before that
   * session holds it; nothing when not parked.
   *
   * @throws io.gpumemd.server.error.ExhaustedException when the memory or the published-bytes
   *     room cannot be had; the object stays parked
   */
  void restoreIfParked(PublishedObject object, String holder, SegmentOwner owner, String who) {
    SharedBlock shared = object.shared();
    assert shared.residency().isHeldByCurrentThread();
    ParkedRange contents = shared.parkedRange();
    if (contents == null) {
      return;
    }
    Block place = shared.block();
    DevicePool pool = pools.get(place.device());
    Block fresh = pool.lease(place.size(), false, holder, owner).block();
    try {
      contents.restoreInto(fresh.memory(), fresh.offset());
      pool.blockShared(fresh);
    } catch (RuntimeException e) {
      pool.release(fresh, null);
      throw e;
    }
    boolean refused;
    synchronized (shared) {
      refused = !pool.publish(fresh);
      if (!refused) {
        for (int i = 1; i < shared.names().size(); i++) {
          pool.publishedAgain();
        }
        shared.restored(fresh);
      }
    }
    if (refused) {
      long bytes = fresh.size();
      pool.sharedBlockReturned();
      pool.release(fresh, null);
      throw Refusals.overPublishedLimit(pool, bytes);
    }
    contents.drop();
    log.atInfo().addKeyValue("object", object.name()).addKeyValue("bytes", contents.length())
        .log("Object '{}' of tenant {} restored for {}: {} from host memory into segment {} of device {}",
        object.name(), object.tenant(), who, Sizes.format(contents.length()), fresh.segmentId(), fresh.device());
  }

  /**
   * Parks idle objects of a device (only their names hold them), least recently looked up first,
   * until {@code bytes} are freed or none is left: the pools' {@link
   * io.gpumemd.server.pool.BudgetRelief} under {@code --park-idle-objects}. An object being
   * parked, restored or dropped by another thread is passed over (never waited for: this runs
   * inside a lease, which may itself be a restore holding another object's residency lock); a
   * full host store ends it.
   *
   * @return device bytes freed
   */
  long parkIdle(Collection<PublishedObject> objects, int device, long bytes) {
    List<PublishedObject> idle = new ArrayList<>();
    for (PublishedObject o : objects) {
      if (!o.shared().parked() && o.shared().block().device() == device && o.shared().parkRefusal() == null) {
        idle.add(o);
      }
    }
    idle.sort(Comparator.comparingLong(o -> o.shared().lastUsedNanos()));
    Set<SharedBlock> seen = Collections.newSetFromMap(new IdentityHashMap<>());
    long freed = 0;
    for (PublishedObject o : idle) {
      SharedBlock shared = o.shared();
      if (freed >= bytes) {
        break;
      }
      if (!seen.add(shared) || !shared.residency().tryLock()) {
        continue;
      }
      try {
        if (shared.parkRefusal() == null) {
          freed += park(o, "the daemon (--park-idle-objects: a lease short of " + Sizes.format(bytes)
              + " on device " + device + ")");
        }
      } catch (ConflictException e) {
        log.debug("Idle {} not parked: {}", describe(o), e.getMessage());
      } catch (ExhaustedException e) {
        log.info("Idle objects not parked: {}", e.getMessage());
        break;
      } finally {
        shared.residency().unlock();
      }
    }
    return freed;
  }

  private static String describe(PublishedObject object) {
    return "object '" + object.name() + "' of tenant " + object.tenant();
  }

  private static String describeNames(List<String> names) {
    return names.size() == 1 ? "Object '" + names.get(0) + "'" : "Objects " + names + " (one block)";
  }
}
