package io.gpumemd.server.session;

import io.gpumemd.server.books.Quota;
import io.gpumemd.server.auth.Caller;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.InMemoryBackend;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.testing.FakeTicker;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * A client's KeepAlive stream breaks and the client reattaches at once: the old stream's
 * detach and the new stream's attach race on different threads. Whatever the order, the new
 * stream must stay attached; before attach and detach were atomic on the session, a detach
 * that checked "is the old stream current?" just before the attach and cleared the channel
 * just after it left a live session without a stream, which the reaper then ended.
 */
class SessionStreamRaceTest {
  private static final int ROUNDS = 20_000;

  @Test
  void lateDetachOfAReplacedStream_neverDetachesTheNewOne() throws Exception {
    FakeTicker ticker = new FakeTicker();
    InMemoryBackend backend = new InMemoryBackend(64L << 20);
    LiveSessions sessions = new LiveSessions();
    DevicePool pool = new DevicePool(backend.devices().get(0), backend, new PoolSettings(64L << 20, 64L << 20, 0),
        sessions, DevicePools.segmentIdBase(0), ticker);
    SessionRegistry registry = new SessionRegistry(new DevicePools(List.of(pool)), backend,
        new SessionSettings(30, 3600, 1000, 0, Quota.UNLIMITED, java.util.Map.of()), ticker, sessions);
    Session session = registry.open(Caller.DAEMON, "flaky-network", 0, -1);
    CyclicBarrier start = new CyclicBarrier(2);
    RecordingChannel[] current = {new RecordingChannel()};
    registry.attach(Caller.DAEMON, session.id(), current[0]);
    int lost = 0;
    for (int round = 0; round < ROUNDS; round++) {
      RecordingChannel old = current[0];
      RecordingChannel fresh = new RecordingChannel();
      Thread detacher = new Thread(() -> {
        await(start);
        registry.detach(session, old);
      });
      detacher.start();
      await(start);
      registry.attach(Caller.DAEMON, session.id(), fresh);
      detacher.join(TimeUnit.SECONDS.toMillis(10));
      current[0] = fresh;
      if (!session.streamAttached()) {
        lost++;
        registry.attach(Caller.DAEMON, session.id(), fresh); // repair, and count the next round afresh
      }
    }
    assertEquals(0, lost, "rounds in which the late detach of the old stream detached the new one");
    // And so the session outlives any grace period while its stream is attached.
    ticker.advance(10, TimeUnit.SECONDS);
    registry.reap();
    assertTrue(session.streamAttached());
    assertEquals(1, registry.sessionCount());
    assertNull(session.expiry(ticker.nanos(), 0));
  }

  private static void await(CyclicBarrier barrier) {
    try {
      barrier.await(10, TimeUnit.SECONDS);
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }
}
