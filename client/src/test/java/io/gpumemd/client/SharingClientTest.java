package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.Await;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.nio.ReadOnlyBufferException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The Java client's sharing API against a live daemon: share tokens and attach, named objects
 * and lookup, read-only holds mapped read-only, and the rule that a shared or published lease
 * and every hold are released to the daemon on close, never kept in the client cache tier.
 * After each test every client is closed, every token revoked and every name unpublished, and
 * the daemon's pools must be empty and consistent.
 */
class SharingClientTest {
  private static final long KiB = 1 << 10;

  private TestDaemon daemon;
  private final List<GpuMemClient> clients = new ArrayList<>();

  @BeforeEach
  void start() {
    daemon = TestDaemon.start();
  }

  @AfterEach
  void stop() {
    try {
      clients.forEach(GpuMemClient::close);
      Await.until(() -> daemon.server().registry().sessionCount() == 0, "every session ended");
      assertEquals(0, daemon.server().registry().sharing().tokenCount(), "share tokens left by the test");
      for (DevicePool pool : daemon.server().pools().all()) {
        assertEquals(0, pool.stats().get(PoolMetric.LEASED_BYTES), "leased bytes after the clients closed");
        assertEquals(0, pool.stats().get(PoolMetric.LIVE_HOLDS), "live holds after the clients closed");
        assertEquals(0, pool.stats().get(PoolMetric.PUBLISHED_OBJECTS), "published objects left by the test");
      }
      daemon.verifyInvariants();
    } finally {
      daemon.close();
    }
  }

  private GpuMemClient client() {
    GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).connect();
    clients.add(client);
    return client;
  }

  private long pool(PoolMetric metric) {
    return daemon.server().pools().get(0).stats().get(metric);
  }

  private static void fill(ByteBuffer buffer, int seed) {
    for (int i = 0; i < buffer.capacity(); i++) {
      buffer.put(i, (byte) (i * 31 + seed));
    }
  }

  private static void assertPattern(ByteBuffer buffer, int seed) {
    for (int i = 0; i < buffer.capacity(); i++) {
      if (buffer.get(i) != (byte) (i * 31 + seed)) {
        throw new AssertionError("byte " + i + ": " + buffer.get(i) + ", expected " + (byte) (i * 31 + seed));
      }
    }
  }

  @Test
  void attach_seesTheOwnersBytes_andTheBlockReturnsWithTheLastHold() {
    GpuMemClient owner = client();
    GpuMemClient consumer = client();
    Lease lease = owner.lease(0, 64 * KiB);
    fill(lease.buffer(), 7);
    Share share = lease.share();
    assertTrue(share.token().matches("[0-9a-f]{32}"), share.token());
    assertEquals(300, share.expiresAfterSeconds(), "the daemon's default life");

    Lease hold = consumer.attach(share.token(), "reader");
    assertTrue(hold.attached());
    assertFalse(hold.readOnly());
    assertFalse(lease.attached());
    assertNotEquals(lease.id(), hold.id(), "a hold has an id of its own");
    assertEquals(lease.segmentId(), hold.segmentId());
    assertEquals(lease.offset(), hold.offset());
    assertEquals(lease.sizeBytes(), hold.sizeBytes());
    assertPattern(hold.buffer(), 7);
    hold.buffer().put(0, (byte) 99);
    assertEquals(99, lease.buffer().get(0), "writes through a writable hold reach the owner");
    assertEquals(1, pool(PoolMetric.LIVE_HOLDS));
    assertEquals(1, pool(PoolMetric.ATTACHES));

    share.close(); // revoke: the token's hold ends, the attached one stays
    lease.close();
    assertEquals(64 * KiB, pool(PoolMetric.LEASED_BYTES), "the consumer's hold keeps the block leased");
    assertEquals(99, hold.buffer().get(0));
    hold.close();
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the block returned with its last hold");
    assertEquals(0, pool(PoolMetric.LIVE_HOLDS));
  }

  @Test
  void sharedLease_andHold_areReleasedOnClose_neverCachedInTheClient() {
    GpuMemClient owner = client();
    assertTrue(owner.stats().allowanceBytes() > 0, "the daemon grants a client cache allowance");
    Lease lease = owner.lease(0, 64 * KiB);
    Share share = lease.share(Duration.ofSeconds(60), false, 0);
    assertEquals(60, share.expiresAfterSeconds());
    Lease hold = owner.attach(share.token());
    hold.close();
    lease.close();
    assertEquals(0, owner.stats().cachedBlocks(), "neither the shared lease nor the hold went into the client cache");
    Await.until(() -> pool(PoolMetric.LIVE_HOLDS) == 0, "the hold was released to the daemon");
    // The lease's release is a stream notice; the revoke below is a call that could overtake it.
    Await.until(() -> daemon.server().registry().liveLeases() == 0, "the lease was released to the daemon");
    assertEquals(0, pool(PoolMetric.CLIENT_CACHED_BYTES));
    assertEquals(64 * KiB, pool(PoolMetric.LEASED_BYTES), "the valid token still holds the block");
    assertTrue(share.revoke(), "revoking the last hold returns the block");
    assertEquals(0, pool(PoolMetric.LEASED_BYTES));
    share.close(); // after revoke: nothing

    // An unshared lease still goes to the client cache as before.
    owner.lease(0, 64 * KiB).close();
    assertEquals(1, owner.stats().cachedBlocks());
  }

  @Test
  void shareOfALeaseServedFromTheClientCache_succeeds_andItIsThenReleased() {
    GpuMemClient owner = client();
    owner.lease(0, 64 * KiB).close();
    assertEquals(1, owner.stats().cachedBlocks());
    Lease reused = owner.lease(0, 64 * KiB);
    assertTrue(reused.localHit());
    // The daemon learns of the reuse on the stream; the share waits for that, not failing.
    try (Share share = reused.share(ShareOptions.oneShot())) {
      Lease hold = client().attach(share.token());
      reused.close();
      assertEquals(0, owner.stats().cachedBlocks(), "a shared lease is never cached");
      hold.close();
    }
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the block returned");
  }

  @Test
  void oneShotToken_servesOneAttach_thenIsNotFound() {
    GpuMemClient owner = client();
    GpuMemClient consumer = client();
    Lease lease = owner.lease(0, 4 * KiB);
    Share share = lease.share(ShareOptions.oneShot());
    assertEquals(1, share.maxAttaches());
    lease.close();
    assertEquals(4 * KiB, pool(PoolMetric.LEASED_BYTES), "the token holds the block after the owner closed");
    Lease hold = consumer.attach(share.token());
    GpuMemException again = assertThrows(GpuMemException.class, () -> consumer.attach(share.token()));
    assertEquals(Status.Code.NOT_FOUND, again.code(), again.getMessage());
    GpuMemException revoke = assertThrows(GpuMemException.class, share::revoke);
    assertEquals(Status.Code.NOT_FOUND, revoke.code(), "a used-up token cannot be revoked");
    share.close(); // quietly: the token is gone
    hold.close();
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the block returned with the consumer's hold");
  }

  @Test
  void attachingTwice_givesTwoHolds_andUnknownTokens_areNotFound() {
    GpuMemClient owner = client();
    Lease lease = owner.lease(0, 4 * KiB);
    try (Share share = lease.share()) {
      GpuMemClient consumer = client();
      Lease first = consumer.attach(share.token());
      Lease second = consumer.attach(share.token());
      assertNotEquals(first.id(), second.id());
      assertEquals(2, pool(PoolMetric.LIVE_HOLDS));
      first.close();
      assertPattern(zeroed(second.buffer()), 0);
      second.close();
      GpuMemException unknown = assertThrows(GpuMemException.class,
          () -> consumer.attach("0123456789abcdef0123456789abcdef"));
      assertEquals(Status.Code.NOT_FOUND, unknown.code());
    }
    lease.close();
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the block returned");
  }

  private static ByteBuffer zeroed(ByteBuffer buffer) {
    fill(buffer, 0);
    return buffer;
  }

  @Test
  void readOnlyHold_isMappedReadOnly_whileTheOwnersLeaseStaysWritable() {
    GpuMemClient owner = client();
    Lease lease = owner.lease(0, 16 * KiB);
    fill(lease.buffer(), 3);
    try (Share share = lease.share(ShareOptions.DEFAULT.withReadOnly(true))) {
      assertTrue(share.readOnly());
      // Same client, same segment: the read-only hold must not get the writable mapping.
      Lease hold = owner.attach(share.token());
      assertTrue(hold.readOnly());
      assertTrue(hold.buffer().isReadOnly());
      assertThrows(ReadOnlyBufferException.class, () -> hold.buffer().put(0, (byte) 1));
      assertPattern(hold.buffer(), 3);
      lease.buffer().put(5, (byte) 42);
      assertEquals(42, hold.buffer().get(5), "the read-only mapping sees the owner's writes");
      assertFalse(lease.buffer().isReadOnly(), "the owner's lease stays writable");

      Lease other = client().attach(share.token());
      assertTrue(other.readOnly());
      assertThrows(ReadOnlyBufferException.class, () -> other.buffer().put(0, (byte) 1));
      other.close();
      hold.close();
    }
    lease.close();
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the block returned");
  }

  @Test
  void publishLookupUnpublish_withPreciseErrors() {
    GpuMemClient owner = client();
    GpuMemClient worker = client();
    Lease lease = owner.lease(0, 32 * KiB);
    fill(lease.buffer(), 11);
    Published published = owner.publish(lease, "llama-3-8b/layer-0", true);
    assertEquals("llama-3-8b/layer-0", published.name());

    GpuMemException exists = assertThrows(GpuMemException.class, () -> owner.publish(lease, "llama-3-8b/layer-0"));
    assertEquals(Status.Code.ALREADY_EXISTS, exists.code(), exists.getMessage());
    GpuMemException control = assertThrows(GpuMemException.class, () -> owner.publish(lease, "bad\nname"));
    assertEquals(Status.Code.INVALID_ARGUMENT, control.code(), control.getMessage());
    GpuMemException empty = assertThrows(GpuMemException.class, () -> owner.publish(lease, ""));
    assertEquals(Status.Code.INVALID_ARGUMENT, empty.code(), empty.getMessage());
    GpuMemException padded = assertThrows(GpuMemException.class, () -> owner.publish(lease, " padded"));
    assertEquals(Status.Code.INVALID_ARGUMENT, padded.code(), padded.getMessage());
    GpuMemException tooLong = assertThrows(GpuMemException.class, () -> owner.publish(lease, "x".repeat(257)));
    assertEquals(Status.Code.INVALID_ARGUMENT, tooLong.code(), tooLong.getMessage());
    GpuMemException unknown = assertThrows(GpuMemException.class, () -> worker.lookup("no-such-object"));
    assertEquals(Status.Code.NOT_FOUND, unknown.code(), unknown.getMessage());
    assertEquals(1, pool(PoolMetric.PUBLISHED_OBJECTS), "the failed publishes changed nothing");

    lease.close(); // the name holds the block
    assertEquals(0, owner.stats().cachedBlocks(), "a published lease is never cached");
    Lease hold = worker.lookup("llama-3-8b/layer-0", "weights");
    assertTrue(hold.attached());
    assertTrue(hold.readOnly(), "the object was published read-only");
    assertThrows(ReadOnlyBufferException.class, () -> hold.buffer().put(0, (byte) 0));
    assertPattern(hold.buffer(), 11);

    published.close(); // unpublish: the lookup's hold stays
    published.close();
    assertEquals(32 * KiB, pool(PoolMetric.LEASED_BYTES));
    GpuMemException gone = assertThrows(GpuMemException.class, () -> worker.lookup("llama-3-8b/layer-0"));
    assertEquals(Status.Code.NOT_FOUND, gone.code());
    GpuMemException twice = assertThrows(GpuMemException.class, () -> worker.unpublish("llama-3-8b/layer-0"));
    assertEquals(Status.Code.NOT_FOUND, twice.code());
    assertPattern(hold.buffer(), 11);
    hold.close();
    Await.until(() -> pool(PoolMetric.LEASED_BYTES) == 0, "the block returned with the last hold");
  }

  @Test
  void unpublishFromAnotherClient_returnsTheBlock_whenTheNameWasTheLastHold() {
    GpuMemClient owner = client();
    Lease lease = owner.lease(0, 8 * KiB);
    owner.publish(lease, "batch-17");
    lease.close();
    owner.close();
    Await.until(() -> daemon.server().registry().sessionCount() == 0, "the owner's session ended");
    assertEquals(8 * KiB, pool(PoolMetric.LEASED_BYTES), "the name outlives its publisher");
    GpuMemClient other = client();
    Lease hold = other.lookup("batch-17");
    assertFalse(hold.readOnly());
    hold.close(); // a notice on the stream: wait until the daemon applied it
    Await.until(() -> pool(PoolMetric.LIVE_HOLDS) == 0, "the hold was released");
    assertTrue(other.unpublish("batch-17"), "the name was the last hold");
    assertEquals(0, pool(PoolMetric.LEASED_BYTES));
  }

  @Test
  void sharingAClosedLease_isRefusedInTheClient() {
    GpuMemClient owner = client();
    Lease lease = owner.lease(0, 4 * KiB);
    lease.close();
    assertThrows(IllegalStateException.class, lease::share);
    assertThrows(IllegalStateException.class, () -> owner.publish(lease, "closed"));
    assertThrows(IllegalArgumentException.class, () -> new ShareOptions(Duration.ofSeconds(-1), false, 0));
    assertThrows(IllegalArgumentException.class, () -> new ShareOptions(Duration.ZERO, false, -1));
  }
}
