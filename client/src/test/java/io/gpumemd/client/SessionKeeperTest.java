package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * {@link SessionKeeper}'s timing with an injected ticker and sleeper: the backoff between
 * attempts to open a new session after a loss, the give-up after {@link
 * SessionKeeper#REOPEN_WAIT_MS}, the backoff carried over to the next call and reset by a
 * session that opens. Real daemons on one socket path; no test thread sleeps through the
 * backoff (the sleeper moves the ticker instead).
 */
class SessionKeeperTest {
  private final FakeTicker ticker = new FakeTicker();
  private final List<Long> sleptMs = new ArrayList<>();
  private final Sleeper sleeper = nanos -> {
    synchronized (sleptMs) {
      sleptMs.add(TimeUnit.NANOSECONDS.toMillis(nanos));
    }
    ticker.advance(nanos, TimeUnit.NANOSECONDS);
  };
  private Path dir;
  private Path socket;

  @BeforeEach
  void makeDir() throws IOException {
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-keeper-");
    socket = dir.resolve("gpumemd.sock");
  }

  @AfterEach
  void removeDir() throws IOException {
    try (Stream<Path> walk = Files.walk(dir)) {
      walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }

  private TestDaemon daemon() {
    return TestDaemon.start("--socket", socket.toString());
  }

  private List<Long> slept() {
    synchronized (sleptMs) {
      List<Long> copy = List.copyOf(sleptMs);
      sleptMs.clear();
      return copy;
    }
  }

  @Test
  void reopen_backsOffFrom50msTo2s_givesUpAfter10s_andResetsOnceASessionOpens() {
    TestDaemon first = daemon();
    GpuMemClient client = GpuMemClient.builder("unix://" + socket).ticker(ticker, sleeper).connect();
    try {
      String lostId = client.sessionId();
      client.lease(0, 4096).close();
      // Past the grace period on the client's clock: however the stream ends, the session is lost at once.
      ticker.advance(1, TimeUnit.SECONDS);
      first.close();
      awaitLost(client);

      GpuMemException refused = assertThrows(GpuMemException.class, () -> client.lease(0, 4096));
      assertEquals(Status.Code.UNAVAILABLE, refused.code(), refused.getMessage());
      assertTrue(refused.getMessage().contains("no new session could be opened yet"), refused.getMessage());
      // 10 attempts: at 0, then after 50, 100, ... ms doubling to 2 s; the 11th would start past 10 s.
      assertEquals(List.of(50L, 100L, 200L, 400L, 800L, 1600L, 2000L, 2000L, 2000L), slept());

      try (TestDaemon second = daemon()) {
        // gRPC's own reconnect backoff runs on the real clock, which the fake one did not move.
        awaitReady(client.connection().channel());
        try (Lease lease = client.lease(0, 4096)) {
          assertFalse(lease.isLost());
        }
        assertEquals(List.of(2000L), slept(), "the backoff carries over: the call waits out the last one, then opens");
        assertNotEquals(lostId, client.sessionId());
        assertFalse(client.sessionLost());
        client.close(); // while the daemon is up, so that it ends the session
      }
    } finally {
      client.close(); // idempotent
    }
  }

  private static void awaitReady(ManagedChannel channel) {
    channel.resetConnectBackoff();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (channel.getState(true) != ConnectivityState.READY) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("the channel did not reconnect to the restarted daemon within 10 s");
      }
      pause();
    }
  }

  private static void pause() {
    try {
      Thread.sleep(5);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new AssertionError(e);
    }
  }

  private static void awaitLost(GpuMemClient client) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!client.sessionLost()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("the session was not seen lost within 10 s of the daemon's shutdown");
      }
      pause();
    }
  }

  @Test
  void theGracePeriod_runsFromWhenTheStreamBroke_notFromWhenTheSessionOpened() {
    SessionStream stream = new SessionStream(() -> false);
    long opened = ticker.nanos();
    ticker.advance(1, TimeUnit.HOURS);
    stream.attached(0);
    long firstBreak = ticker.nanos();
    assertEquals(firstBreak, stream.broken(firstBreak), "an hour after the session opened, the clock starts now");
    assertNotEquals(opened, firstBreak);
    ticker.advance(300, TimeUnit.MILLISECONDS);
    assertEquals(firstBreak, stream.broken(ticker.nanos()), "a reattach that fails again keeps counting");
    stream.attached(0);
    ticker.advance(5, TimeUnit.SECONDS);
    assertEquals(ticker.nanos(), stream.broken(ticker.nanos()), "a confirmed stream starts a new grace period");
  }
}
