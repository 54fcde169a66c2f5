package io.gpumemd.server.session;

import static io.gpumemd.server.session.SessionSleepTest.read;
import static io.gpumemd.server.session.SessionSleepTest.segments;
import static io.gpumemd.server.session.SessionSleepTest.write;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.sharing.SharedObjects;
import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Sleep of a lease whose block is shared (issue 35 item 4), over a real host-backend pool: the
 * sleep waits for the other sessions' holds, is refused naming those left, and the block's names
 * and tokens refuse while it sleeps and refer to its new block once it wakes.
 */
class SharedSleepTest {
  private static final long MIB = 1 << 20;

  @TempDir
  Path dir;

  private SessionSleepTest.Pool pool;
  private DevicePools pools;
  private SessionRegistry registry;

  private void start(long poolBytes, long unmapWaitMillis) {
    pool = SessionSleepTest.Pool.start(dir, poolBytes, unmapWaitMillis, 64 * MIB);
    pools = pool.pools();
    registry = pool.registry();
  }

  @AfterEach
  void verifyAndClose() {
    if (pool != null) {
      pool.close();
    }
  }

  private long stat(PoolMetric metric) {
    return pools.get(0).stats().get(metric);
  }

  private LeaseRecord lease(Session s, long bytes, String tag) {
    return registry.lease(Caller.DAEMON, s.id(), 0, bytes, false, tag, false);
  }

  private LeaseRecord lookup(Session s, String name) {
    return registry.sharing().lookup(Caller.DAEMON, s.id(), name, "");
  }

  @Test
  void holderReleasingWithinTheWait_letsTheSleepFinish_andTheFreedMemoryServesAnother() throws Exception {
    start(4 * MIB, TimeUnit.MINUTES.toMillis(1));
    Session owner = registry.open(Caller.DAEMON, "owner", 0, -1);
    Session holder = registry.open(Caller.DAEMON, "holder", 0, -1);
    Session other = registry.open(Caller.DAEMON, "other", 0, -1);
    LeaseRecord weights = lease(owner, 3 * MIB, "weights");
    byte[] bytes = write(weights, 11);
    registry.sharing().publish(Caller.DAEMON, owner.id(), weights.id(), "w", true);
    LeaseRecord hold = lookup(holder, "w");
    assertThrows(ExhaustedException.class, () -> lease(other, 3 * MIB, ""), "the pool is full");

    // The holder lets go once the sleep has closed the block (a lookup says so), as a client
    // told to unmap would; the sleep waits for it, up to a minute here.
    CompletableFuture<Void> letGo = CompletableFuture.runAsync(() -> {
      while (!closed("w")) {
        Thread.onSpinWait();
      }
      registry.release(Caller.DAEMON, holder.id(), hold.id(), new byte[0]);
    });
    SessionSleep.Slept slept = registry.sleep().sleep(Caller.DAEMON, owner.id(), 1, List.of(), segments(weights));
    letGo.get(1, TimeUnit.MINUTES);
    // The pool asked the holder, which still maps the segment, to unmap it; it confirms.
    registry.unmapped(holder, List.of(hold.block().segmentId()));

    assertEquals(List.of(weights.id()), slept.leaseIds());
    assertEquals(weights.block().size(), slept.freedBytes());
    assertNotNull(weights.asleep());
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    LeaseRecord theirs = lease(other, 3 * MIB, "");
    assertNotNull(theirs, "the slept block's memory serves another session");
    registry.close(Caller.DAEMON, other.id()); // it maps the segment it leased until it ends

    registry.sleep().wake(Caller.DAEMON, owner.id());
    LeaseRecord again = lookup(holder, "w");
    assertEquals(weights.block().segmentId(), again.block().segmentId(), "the name refers to the woken block");
    assertEquals(weights.block().offset(), again.block().offset());
    assertArrayEquals(bytes, read(again));
  }

  /** Whether a lookup of {@code name} is refused for a sleep (closed, or asleep). */
  private boolean closed(String name) {
    Session probe = registry.open(Caller.DAEMON, "probe", 0, -1);
    try {
      LeaseRecord hold = lookup(probe, name);
      registry.release(Caller.DAEMON, probe.id(), hold.id(), new byte[0]);
      return false;
    } catch (ConflictException e) {
      return true;
    } finally {
      registry.close(Caller.DAEMON, probe.id());
    }
  }

  @Test
  void holderKeepingItsHold_refusesTheSleep_namingIt_afterTheWait_andNothingChanges() throws IOException {
    start(64 * MIB, 50);
    Session owner = registry.open(Caller.DAEMON, "owner", 0, -1);
    Session holder = registry.open(Caller.DAEMON, "holder", 0, -1);
    LeaseRecord weights = lease(owner, 3 * MIB, "weights");
    byte[] bytes = write(weights, 12);
    SharedObjects.Share share = registry.sharing().share(Caller.DAEMON, owner.id(), weights.id(), 600, false, 0);
    LeaseRecord hold = registry.sharing().attach(Caller.DAEMON, holder.id(), share.token(), "");
    long leased = stat(PoolMetric.LEASED_BYTES);
    long reserved = stat(PoolMetric.RESERVED_BYTES);

    ConflictException refused = assertThrows(ConflictException.class,
        () -> registry.sleep().sleep(Caller.DAEMON, owner.id(), 1, List.of(), segments(weights)));

    String message = refused.getMessage();
    assertTrue(message.contains(holder.toString()) && message.contains("hold " + hold.id()), message);
    assertTrue(message.contains("50 ms") && message.contains("--unmap-wait-ms"), message);
    assertNull(weights.asleep());
    assertEquals(0, owner.sleepFigures()[0]);
    assertEquals(leased, stat(PoolMetric.LEASED_BYTES));
    assertEquals(reserved, stat(PoolMetric.RESERVED_BYTES));
    assertEquals(0, registry.sleep().store().heldBytes());
    assertArrayEquals(bytes, read(weights));
    assertArrayEquals(bytes, read(hold));
    LeaseRecord another = registry.sharing().attach(Caller.DAEMON, holder.id(), share.token(), "");
    assertEquals(weights.block().segmentId(), another.block().segmentId(), "the block takes holds again");
    assertNotNull(lease(owner, MIB, ""), "the owner is awake: it leases");
  }

  @Test
  void sleepingBlock_refusesLookupAndAttach_namingTheSleep_andItsNamesFollowTheWake() throws IOException {
    start(64 * MIB, 50);
    Session owner = registry.open(Caller.DAEMON, "owner", 0, -1);
    Session reader = registry.open(Caller.DAEMON, "reader", 0, -1);
    LeaseRecord weights = lease(owner, 3 * MIB, "weights");
    byte[] bytes = write(weights, 13);
    long oldSegment = weights.block().segmentId();
    registry.sharing().publish(Caller.DAEMON, owner.id(), weights.id(), "w", true);
    registry.sharing().publish(Caller.DAEMON, owner.id(), weights.id(), "w2", true);
    SharedObjects.Share share = registry.sharing().share(Caller.DAEMON, owner.id(), weights.id(), 600, false, 1);
    registry.sleep().sleep(Caller.DAEMON, owner.id(), 1, List.of(), segments(weights));
    int records = registry.liveLeases();

    ConflictException byName = assertThrows(ConflictException.class, () -> lookup(reader, "w2"));
    assertTrue(byName.getMessage().contains("object 'w2' sleeps with " + owner), byName.getMessage());
    assertTrue(byName.getMessage().contains("comes back when that session wakes"), byName.getMessage());
    ConflictException byToken = assertThrows(ConflictException.class,
        () -> registry.sharing().attach(Caller.DAEMON, reader.id(), share.token(), ""));
    assertTrue(byToken.getMessage().contains("sleeps with " + owner), byToken.getMessage());
    assertEquals(records, registry.liveLeases(), "a refused hold takes nothing");
    assertEquals(0, stat(PoolMetric.PUBLISHED_BYTES), "a sleeping block's names hold no device memory");
    assertThrows(ConflictException.class, () -> registry.sharing().park(Caller.DAEMON, "", "w"),
        "a sleeping object is not parked");

    registry.sleep().wake(Caller.DAEMON, owner.id());

    assertNotEquals(oldSegment, weights.block().segmentId());
    assertEquals(weights.block().size(), stat(PoolMetric.PUBLISHED_BYTES), "published again, once for two names");
    LeaseRecord byNameAfter = lookup(reader, "w");
    LeaseRecord byTokenAfter = registry.sharing().attach(Caller.DAEMON, reader.id(), share.token(), "");
    for (LeaseRecord hold : List.of(byNameAfter, byTokenAfter)) {
      assertEquals(weights.block().segmentId(), hold.block().segmentId());
      assertEquals(weights.block().offset(), hold.block().offset());
      assertArrayEquals(bytes, read(hold));
    }
  }

  @Test
  void unpublishAndRevoke_whileAsleep_atLevelTwoWithTags() throws IOException {
    start(64 * MIB, 50);
    Session owner = registry.open(Caller.DAEMON, "owner", 0, -1);
    LeaseRecord kv = lease(owner, 3 * MIB, "kv");
    write(kv, 14);
    LeaseRecord weights = lease(owner, 5 * MIB, "weights");
    byte[] w = write(weights, 15);
    registry.sharing().publish(Caller.DAEMON, owner.id(), kv.id(), "kv", false);
    registry.sharing().publish(Caller.DAEMON, owner.id(), weights.id(), "weights", true);
    SharedObjects.Share share = registry.sharing().share(Caller.DAEMON, owner.id(), kv.id(), 600, false, 0);

    registry.sleep().sleep(Caller.DAEMON, owner.id(), 2, List.of("kv"), segments(kv));
    assertNull(weights.asleep(), "another segment, another tag: awake");

    assertFalse(registry.sharing().unpublish(Caller.DAEMON, owner.id(), "kv"), "its lease still holds it");
    assertFalse(registry.sharing().revoke(Caller.DAEMON, owner.id(), share.token()));
    assertThrows(NotFoundException.class, () -> lookup(owner, "kv"));
    registry.sleep().wake(Caller.DAEMON, owner.id());

    assertArrayEquals(new byte[(int) kv.block().size()], read(kv), "level 2 wakes zeroed");
    assertArrayEquals(w, read(lookup(owner, "weights")));
    assertEquals(weights.block().size(), stat(PoolMetric.PUBLISHED_BYTES), "only the awake name counts");
  }

  @Test
  void leaseReleasedWhileAsleep_leavesItsNamesHoldingNothing_untilUnpublished() {
    start(64 * MIB, 50);
    Session owner = registry.open(Caller.DAEMON, "owner", 0, -1);
    LeaseRecord weights = lease(owner, 3 * MIB, "weights");
    registry.sharing().publish(Caller.DAEMON, owner.id(), weights.id(), "w", true);
    registry.sleep().sleep(Caller.DAEMON, owner.id(), 1, List.of(), segments(weights));

    registry.close(Caller.DAEMON, owner.id());

    assertEquals(0, registry.sleep().store().heldBytes(), "its contents went with the lease");
    Session reader = registry.open(Caller.DAEMON, "reader", 0, -1);
    ConflictException gone = assertThrows(ConflictException.class, () -> lookup(reader, "w"));
    assertTrue(gone.getMessage().contains("released it while asleep"), gone.getMessage());
    assertTrue(registry.sharing().parkedObjects().toString().contains("'w'"), "a take-over names it");
    assertTrue(registry.sharing().unpublish(Caller.DAEMON, reader.id(), "w"), "its last hold");
    assertEquals(List.of(), registry.sharing().parkedObjects());
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
  }
}
