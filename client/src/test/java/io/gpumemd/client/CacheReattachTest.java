package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The client cache tier across a broken KeepAlive stream, with a real daemon: the connection is
 * broken by killing (SIGKILL) a proxy process between client and daemon (the Python client's
 * {@code tests/stream_proxy.py}), and the client reattaches within the daemon's grace. The
 * tier's notices, including those handed to gRPC as the connection died, reach the daemon: its
 * books of the session end up the client's.
 */
class CacheReattachTest {
  private static final long BLOCK = 64 << 10;
  private static final Path PROXY = Path.of("..", "python", "tests", "stream_proxy.py").toAbsolutePath().normalize();
  private TestDaemon daemon;
  private Process proxy;
  private Channels.Connection admin;

  @TempDir Path dir;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--keepalive-grace-ms", "60000", "--client-cache-bytes", String.valueOf(8 * BLOCK));
    admin = Channels.open(daemon.unixTarget()); // straight to the daemon, not through the proxy
  }

  @AfterEach
  void stop() throws Exception {
    if (proxy != null) {
      kill();
    }
    admin.close();
    daemon.verifyInvariants();
    daemon.close();
  }

  @Test
  void noticesSentAsTheStreamBreaks_reachTheDaemon() throws Exception {
    Path socket = dir.resolve("proxy.sock");
    startProxy(socket);
    try (GpuMemClient client = GpuMemClient.connect("unix://" + socket)) {
      List<Lease> held = new ArrayList<>();
      for (int i = 0; i < 10; i++) {
        held.add(client.lease(0, BLOCK));
      }
      for (Lease lease : held.subList(0, 6)) {
        lease.close();
      }
      await(() -> booksAgree(client, 4), () -> state(client), "the books before the break");
      held.subList(6, 10).forEach(Lease::close);
      await(() -> booksAgree(client, 0), () -> state(client), "the books with 8 cached");

      // Breaks the client has not seen yet when the tier moves leases: some notices go to a
      // stream that is already dead, or into the proxy's socket as it dies.
      for (int round = 0; round < 20; round++) {
        List<Lease> again = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
          again.add(client.lease(0, BLOCK));
        }
        await(() -> booksAgree(client, 3), () -> state(client), "round " + round + ": the reuses applied");
        if (round % 2 == 0) {
          kill(); // the client has likely not seen the break when the notices go out
          again.forEach(Lease::close);
        } else {
          again.forEach(Lease::close); // their flush, a millisecond later, meets the kill
          kill();
        }
        startProxy(socket);
        int r = round;
        await(() -> booksAgree(client, 0), () -> state(client), "round " + r + ": the books after the reattach");
      }
      assertTrue(!client.sessionLost());
    }
    assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES));
    assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.CLIENT_CACHED_BYTES));
  }

  /** The daemon's books of the session are the client's: leases (cached and open), cached bytes, counters. */
  private boolean booksAgree(GpuMemClient client, int open) {
    SessionInfo info = session(client);
    ClientStats stats = client.stats();
    return info != null && info.getStreamAttached()
        && info.getLeases() == stats.cachedBlocks() + open
        && info.getClientCachedBytes() == stats.cachedBytes()
        && info.getClientCacheHits() == stats.localHits()
        && info.getClientCacheReturns() == stats.localReturns();
  }

  private String state(GpuMemClient client) {
    return "daemon: " + session(client) + "; client: " + client.stats();
  }

  private SessionInfo session(GpuMemClient client) {
    String id = client.sessionId();
    return AdminGrpc.newBlockingStub(admin.channel()).listSessions(ListSessionsRequest.getDefaultInstance())
        .getSessionsList().stream().filter(s -> s.getSessionId().equals(id)).findFirst().orElse(null);
  }

  private void startProxy(Path socket) throws Exception {
    proxy = new ProcessBuilder("/usr/bin/python3", PROXY.toString(), socket.toString(),
        daemon.unixTarget().substring("unix://".length())).redirectErrorStream(true).start();
    BufferedReader out = new BufferedReader(new InputStreamReader(proxy.getInputStream(), StandardCharsets.UTF_8));
    assertEquals("ready", out.readLine());
  }

  private void kill() throws Exception {
    proxy.destroyForcibly(); // SIGKILL: every connection through it closes at once
    assertTrue(proxy.waitFor(30, TimeUnit.SECONDS));
    proxy = null;
  }

  /** Waits (bounded, 30 s) for {@code done}; fails with {@code what} and the state if it never holds. */
  private static void await(BooleanSupplier done, Supplier<String> state, String what) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (!done.getAsBoolean() && System.nanoTime() < deadline) {
      Thread.sleep(20);
    }
    assertTrue(done.getAsBoolean(), () -> what + ": " + state.get());
  }
}
