package io.gpumemd.server.sharing;

import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.books.Page;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.AlreadyExistsException;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.error.PermissionDeniedException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.RecordingChannel;
import io.gpumemd.server.testing.FakeTicker;
import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Share tokens, attaches and published names over real host-backend pools, with a fake clock:
 * a block returns to the pool exactly when its last hold (lease, attach, token, name) goes, a
 * failed call changes nothing, tenants never see each other's tokens or names, and the pool's
 * books balance after every case ({@link DevicePool#verifyInvariants}).
 */
class SharingTest {
  private static final long MIB = 1 << 20;
  private static final Caller ALICE = new Caller("uid:1000", "uid 1000", false, 1000, 1000, 11, "pid 11");
  private static final Caller ALICE2 = new Caller("uid:1000", "uid 1000", false, 1000, 1000, 12, "pid 12");
  private static final Caller BOB = new Caller("uid:2000", "uid 2000", false, 2000, 2000, 21, "pid 21");
  private static final byte[] NO_EVENT = new byte[0];

  @TempDir
  Path dir;

  private final FakeTicker ticker = new FakeTicker();
  private HostShmBackend backend;
  private DevicePools pools;
  private SessionRegistry registry;
  private SharedObjects sharing;

  private void start(SessionSettings settings, long publishedLimit) {
    backend = new HostShmBackend(dir.resolve("shm"), 1, 64 * MIB, null);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend,
        new PoolSettings(64 * MIB, 64 * MIB, 20 * MIB, 0, publishedLimit), sessions, DevicePools.segmentIdBase(0),
        ticker);
    pools = new DevicePools(List.of(pool));
    registry = new SessionRegistry(pools, backend, settings, ticker, sessions);
    sharing = registry.sharing();
  }

  private void start(SharingSettings sharingSettings, long publishedLimit) {
    start(SessionSettings.defaults().withSharing(sharingSettings), publishedLimit);
  }

  private void start() {
    start(SharingSettings.DEFAULTS, 64 * MIB);
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

  private Session open(Caller caller, String name) {
    return registry.open(caller, name, 30, 0);
  }

  private LeaseRecord lease(Caller caller, Session session, long size) {
    return registry.lease(caller, session.id(), 0, size, false, "t", false);
  }

  private static MappedByteBuffer map(LeaseRecord lease) throws IOException {
    String path = ((io.gpumemd.server.backend.IpcHandle.HostShm) lease.block().memory().handle()).path();
    try (FileChannel ch = FileChannel.open(Path.of(path), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      return ch.map(FileChannel.MapMode.READ_WRITE, lease.block().offset(), lease.block().size());
    }
  }

  @Test
  void oneShotToken_outlivesTheProducer_blockReturnsWhenTheConsumerReleases() throws IOException {
    start();
    Session producer = open(ALICE, "producer");
    LeaseRecord lease = lease(ALICE, producer, 100_000);
    map(lease).putLong(0, 0x5eed_f00dL);
    SharedObjects.Share share = sharing.share(ALICE, producer.id(), lease.id(), 0, false, 1);
    assertEquals(32, share.token().length());
    assertEquals(300, share.expiresAfterSeconds());
    registry.close(ALICE, producer.id());
    assertEquals(lease.block().size(), stat(PoolMetric.LEASED_BYTES), "the token holds the block");
    assertEquals(1, stat(PoolMetric.SHARED_BLOCKS));

    Session consumer = open(ALICE2, "consumer");
    LeaseRecord hold = sharing.attach(ALICE2, consumer.id(), share.token(), "kv");
    assertTrue(hold.attached());
    assertNotEquals(lease.id(), hold.id());
    assertEquals(lease.block().segmentId(), hold.block().segmentId());
    assertEquals(lease.block().offset(), hold.block().offset());
    assertEquals(0x5eed_f00dL, map(hold).getLong(0));
    assertEquals(1, hold.shared().holds(), "the one-shot token's hold passed to the consumer");
    assertThrows(NotFoundException.class, () -> sharing.attach(ALICE2, consumer.id(), share.token(), ""),
        "a used-up token");
    assertEquals(1, stat(PoolMetric.LIVE_HOLDS));
    assertEquals(1, stat(PoolMetric.ATTACHES));
    assertEquals(1, stat(PoolMetric.SHARES));

    registry.release(ALICE2, consumer.id(), hold.id(), NO_EVENT);
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.LIVE_HOLDS));
    assertEquals(0, stat(PoolMetric.SHARED_BLOCKS));
    assertThrows(NotFoundException.class, () -> registry.release(ALICE2, consumer.id(), hold.id(), NO_EVENT));
  }

  @Test
  void everyHoldCounts_theBlockReturnsWithTheLastOneOnly() {
    start();
    Session owner = open(ALICE, "owner");
    Session reader = open(ALICE2, "reader");
    LeaseRecord lease = lease(ALICE, owner, 4096);
    String token = sharing.share(ALICE, owner.id(), lease.id(), 60, false, 0).token();
    LeaseRecord a = sharing.attach(ALICE2, reader.id(), token, "");
    LeaseRecord b = sharing.attach(ALICE2, reader.id(), token, "");
    assertEquals(4, a.shared().holds(), "lease, token and two attaches of the same session");
    assertEquals(List.of(owner.id(), reader.id()), a.shared().holderSessionIds());
    long[] held = reader.holdings();
    assertEquals(0, held[0], "holds are not leases");
    assertEquals(2, held[3]);
    assertEquals(2 * 4096, held[4]);

    registry.release(ALICE, owner.id(), lease.id(), NO_EVENT);
    assertTrue(sharing.revoke(ALICE, reader.id(), token) == false);
    registry.release(ALICE2, reader.id(), a.id(), NO_EVENT);
    assertEquals(4096, stat(PoolMetric.LEASED_BYTES), "one hold is left");
    registry.close(ALICE2, reader.id());
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.ACTIVE_LEASES));
  }

  @Test
  void tokenExpiry_dropsTheTokensHold() {
    start();
    Session owner = open(ALICE, "owner");
    LeaseRecord lease = lease(ALICE, owner, 4096);
    String token = sharing.share(ALICE, owner.id(), lease.id(), 5, false, 0).token();
    registry.close(ALICE, owner.id());
    ticker.advance(4, TimeUnit.SECONDS);
    registry.reap();
    assertEquals(4096, stat(PoolMetric.LEASED_BYTES));
    ticker.advance(2, TimeUnit.SECONDS);
    Session late = open(ALICE2, "late");
    assertThrows(NotFoundException.class, () -> sharing.attach(ALICE2, late.id(), token, ""));
    registry.reap();
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, sharing.tokenCount());
  }

  @Test
  void tokenLife_isCappedBySettings() {
    start(new SharingSettings(300, 600, 4096, 4096, 16_384), 64 * MIB);
    Session owner = open(ALICE, "owner");
    LeaseRecord lease = lease(ALICE, owner, 4096);
    assertEquals(600, sharing.share(ALICE, owner.id(), lease.id(), 100_000, false, 0).expiresAfterSeconds());
    assertThrows(InvalidRequestException.class, () -> sharing.share(ALICE, owner.id(), lease.id(), -1, false, 0));
  }

  @Test
  void publishedObject_outlivesItsPublisher_untilUnpublished() {
    start();
    Session loader = open(ALICE, "loader");
    LeaseRecord lease = lease(ALICE, loader, 3 * MIB);
    sharing.publish(ALICE, loader.id(), lease.id(), "llama-3-8b/layer-0", true);
    assertThrows(AlreadyExistsException.class,
        () -> sharing.publish(ALICE, loader.id(), lease.id(), "llama-3-8b/layer-0", false));
    assertEquals(1, stat(PoolMetric.PUBLISHED_OBJECTS), "the refused publish changed nothing");
    assertEquals(lease.block().size(), stat(PoolMetric.PUBLISHED_BYTES));
    registry.close(ALICE, loader.id());

    Session worker = open(ALICE2, "worker");
    LeaseRecord hold = sharing.lookup(ALICE2, worker.id(), "llama-3-8b/layer-0", "weights");
    assertTrue(hold.readOnly());
    assertEquals("llama-3-8b/layer-0", hold.shared().name());
    Page<PublishedObject> page = sharing.objects(ALICE2, null, null, 10);
    assertEquals(1, page.total());
    assertEquals(1, page.items().get(0).lookups().get());
    // Another tenant neither sees nor reaches it.
    Session bob = open(BOB, "bob");
    assertEquals(0, sharing.objects(BOB, null, null, 10).total());
    assertThrows(NotFoundException.class, () -> sharing.lookup(BOB, bob.id(), "llama-3-8b/layer-0", ""));
    assertThrows(NotFoundException.class, () -> sharing.unpublish(BOB, bob.id(), "llama-3-8b/layer-0"));
    assertThrows(PermissionDeniedException.class, () -> sharing.remove(BOB, "uid:1000", "llama-3-8b/layer-0"));

    assertFalse(sharing.unpublish(ALICE2, worker.id(), "llama-3-8b/layer-0"), "the worker still holds it");
    assertEquals(0, stat(PoolMetric.PUBLISHED_BYTES));
    assertThrows(NotFoundException.class, () -> sharing.lookup(ALICE2, worker.id(), "llama-3-8b/layer-0", ""));
    registry.release(ALICE2, worker.id(), hold.id(), NO_EVENT);
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
  }

  @Test
  void adminRemovesAnotherTenantsObject() {
    start();
    Session loader = open(ALICE, "loader");
    LeaseRecord lease = lease(ALICE, loader, 4096);
    sharing.publish(ALICE, loader.id(), lease.id(), "x", false);
    registry.close(ALICE, loader.id());
    assertTrue(sharing.remove(Caller.DAEMON, "uid:1000", "x"));
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertThrows(NotFoundException.class, () -> sharing.remove(Caller.DAEMON, "uid:1000", "x"));
  }

  @Test
  void tokensOfAnotherTenant_answerLikeUnknownOnes() {
    start();
    Session owner = open(ALICE, "owner");
    LeaseRecord lease = lease(ALICE, owner, 4096);
    String token = sharing.share(ALICE, owner.id(), lease.id(), 0, false, 0).token();
    Session bob = open(BOB, "bob");
    NotFoundException foreign = assertThrows(NotFoundException.class, () -> sharing.attach(BOB, bob.id(), token, ""));
    NotFoundException unknown = assertThrows(NotFoundException.class,
        () -> sharing.attach(BOB, bob.id(), SecureIds.next(), ""));
    assertEquals(unknown.getMessage(), foreign.getMessage());
    assertThrows(NotFoundException.class, () -> sharing.revoke(BOB, bob.id(), token));
    assertThrows(NotFoundException.class, () -> sharing.share(BOB, bob.id(), lease.id(), 0, false, 0),
        "another session's lease");
    assertThrows(InvalidRequestException.class, () -> sharing.attach(BOB, bob.id(), "not-a-token", ""));
    assertEquals(0, stat(PoolMetric.LIVE_HOLDS));
  }

  @Test
  void badNames_areInvalidArgument_andChangeNothing() {
    start();
    Session s = open(ALICE, "s");
    LeaseRecord lease = lease(ALICE, s, 4096);
    for (String name : new String[] {"", "a\tb", "line\nfeed", "x".repeat(257), "a\u202eb", "zero\u200bwidth",
        "a\u2028b", "\ufeffbom", " ", " lead", "trail ", "\ud800lone", "\u00a0nbsp", "\ud83d\ude00".repeat(257)}) {
      assertThrows(InvalidRequestException.class, () -> sharing.publish(ALICE, s.id(), lease.id(), name, false), name);
    }
    assertEquals(0, stat(PoolMetric.SHARED_BLOCKS), "refused names changed nothing");
    sharing.publish(ALICE, s.id(), lease.id(), "x".repeat(256), false);
    // 256 characters outside the BMP are 512 UTF-16 units: still 256 characters.
    sharing.publish(ALICE, s.id(), lease.id(), "\ud83d\ude00".repeat(256), false);
    sharing.publish(ALICE, s.id(), lease.id(), "llama-3-8b/layer 0 (fp16, Zürich)", false);
    assertEquals(3, stat(PoolMetric.PUBLISHED_OBJECTS));
    assertEquals(4, lease.shared().holds());
  }

  @Test
  void clientCachedLease_cannotBeShared_andASharedLeaseCannotBeCached() {
    start();
    Session s = registry.open(ALICE, "s", 30, MIB); // a client cache allowance: caching is allowed at all
    LeaseRecord cached = lease(ALICE, s, 4096);
    LeaseRecord shared = lease(ALICE, s, 4096);
    assertTrue(registry.clientCache().cached(s, List.of(cached.id())).isEmpty());
    assertThrows(ConflictException.class, () -> sharing.share(ALICE, s.id(), cached.id(), 0, false, 0));
    assertEquals(0, stat(PoolMetric.SHARED_BLOCKS), "the refused share changed nothing");
    sharing.share(ALICE, s.id(), shared.id(), 0, false, 0);
    assertEquals(1, registry.clientCache().cached(s, List.of(shared.id())).size(), "a shared lease is refused by the cache tier");
    Session t = open(ALICE2, "t");
    assertEquals(0, t.holdings()[3]);
  }

  @Test
  void holdsToken_andPublishedBytes_areBounded() {
    start(new SharingSettings(300, 3600, 2, 3, 16_384), 4 * MIB);
    Session s = open(ALICE, "s");
    Session r = open(ALICE2, "r");
    LeaseRecord small = lease(ALICE, s, 4096);
    LeaseRecord big = lease(ALICE, s, 6 * MIB);
    String token = sharing.share(ALICE, s.id(), small.id(), 0, false, 0).token();
    sharing.attach(ALICE2, r.id(), token, "");
    sharing.attach(ALICE2, r.id(), token, "");
    ExhaustedException holds = assertThrows(ExhaustedException.class, () -> sharing.attach(ALICE2, r.id(), token, ""));
    assertTrue(holds.getMessage().contains("--max-holds-per-session"), holds.getMessage());
    ExhaustedException published = assertThrows(ExhaustedException.class,
        () -> sharing.publish(ALICE, s.id(), big.id(), "big", false));
    assertTrue(published.getMessage().contains("--max-published-bytes"), published.getMessage());
    assertEquals(0, stat(PoolMetric.PUBLISHED_BYTES));
    sharing.publish(ALICE, s.id(), small.id(), "small", false);
    sharing.share(ALICE, s.id(), small.id(), 0, false, 0);
    ExhaustedException shares = assertThrows(ExhaustedException.class,
        () -> sharing.share(ALICE, s.id(), small.id(), 0, false, 0));
    assertTrue(shares.getMessage().contains("--max-shares-per-tenant"), shares.getMessage());
    assertEquals(2, r.holdings()[3]);
  }

  @Test
  void holds_doNotCountAgainstTheSessionsLeaseQuota() {
    start(new SessionSettings(30, 3600, 2000, 0, new Quota(8192, 1), Map.of()), 64 * MIB);
    Session owner = open(ALICE, "owner");
    Session reader = open(ALICE2, "reader");
    LeaseRecord lease = lease(ALICE, owner, 8192);
    String token = sharing.share(ALICE, owner.id(), lease.id(), 0, false, 0).token();
    LeaseRecord mine = lease(ALICE2, reader, 8192);
    sharing.attach(ALICE2, reader.id(), token, "");
    sharing.attach(ALICE2, reader.id(), token, "");
    ExhaustedException quota = assertThrows(ExhaustedException.class, () -> lease(ALICE2, reader, 512));
    assertTrue(quota.getMessage().contains("max-leases=1 reached (1 leases held"), quota.getMessage());
    registry.release(ALICE2, reader.id(), mine.id(), NO_EVENT);
    lease(ALICE2, reader, 8192);
  }

  @Test
  void attachedSegment_isFreedOnlyAfterTheAttachedHolderUnmaps() {
    start();
    Session owner = open(ALICE, "owner");
    Session reader = open(ALICE2, "reader");
    RecordingChannel ownerStream = new RecordingChannel();
    RecordingChannel readerStream = new RecordingChannel();
    registry.attach(ALICE, owner.id(), ownerStream);
    registry.attach(ALICE2, reader.id(), readerStream);
    LeaseRecord lease = lease(ALICE, owner, 4 * MIB);
    String token = sharing.share(ALICE, owner.id(), lease.id(), 0, false, 1).token();
    LeaseRecord hold = sharing.attach(ALICE2, reader.id(), token, "");
    registry.release(ALICE, owner.id(), lease.id(), NO_EVENT);
    assertEquals(0, pools.get(0).trim(0), "a segment with a held block is not evictable");
    registry.release(ALICE2, reader.id(), hold.id(), NO_EVENT);
    pools.get(0).trim(0);
    long segment = lease.block().segmentId();
    assertEquals(List.of(segment), readerStream.unmapRequests, "the attached holder is asked to unmap");
    assertEquals(List.of(segment), ownerStream.unmapRequests);
    assertEquals(1, stat(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    registry.unmapped(owner, List.of(segment));
    assertEquals(1, stat(PoolMetric.SEGMENTS_AWAITING_UNMAP), "still mapped by the reader");
    registry.unmapped(reader, List.of(segment));
    assertEquals(0, stat(PoolMetric.SEGMENTS_AWAITING_UNMAP));
    assertEquals(0, stat(PoolMetric.SEGMENTS));
  }

  @Test
  void shutdown_dropsTokensAndNames() {
    start();
    Session s = open(ALICE, "s");
    LeaseRecord lease = lease(ALICE, s, 4096);
    sharing.share(ALICE, s.id(), lease.id(), 0, false, 0);
    sharing.publish(ALICE, s.id(), lease.id(), "n", false);
    registry.endAll("shutdown");
    assertEquals(0, stat(PoolMetric.LEASED_BYTES));
    assertEquals(0, stat(PoolMetric.PUBLISHED_OBJECTS));
    assertEquals(0, sharing.tokenCount());
  }
}
