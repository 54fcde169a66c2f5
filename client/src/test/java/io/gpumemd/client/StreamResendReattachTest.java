package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Stream leases and releases across broken KeepAlive streams, with a real daemon: a proxy
 * process between client and daemon ({@code python/tests/stream_proxy.py}) is SIGKILLed again
 * and again while two threads lease and release in a loop on the session's stream (no client
 * cache: every lease is a round trip, every release a notice). The client numbers its
 * messages and sends again, on the next stream, those the daemon had not applied
 * (StreamAttached.applied_messages): every call succeeds, and the daemon's leases of the
 * session are the client's.
 */
class StreamResendReattachTest {
  private static final long BLOCK = 64 << 10;
  private static final Path PROXY = Path.of("..", "python", "tests", "stream_proxy.py").toAbsolutePath().normalize();
  private TestDaemon daemon;
  private Process proxy;
  private Channels.Connection admin;

  @TempDir Path dir;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--keepalive-grace-ms", "60000", "--client-cache-bytes", "0");
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
  void leasesAndReleasesInFlightAsTheStreamBreaks_areAppliedOnce() throws Exception {
    Path socket = dir.resolve("proxy.sock");
    startProxy(socket);
    List<Lease> open;
    try (GpuMemClient client = GpuMemClient.connect("unix://" + socket)) {
      String session = client.sessionId();
      ConcurrentLinkedQueue<Lease> held = new ConcurrentLinkedQueue<>();
      AtomicBoolean stop = new AtomicBoolean();
      AtomicLong calls = new AtomicLong();
      List<Throwable> failures = new ArrayList<>();
      List<Thread> workers = new ArrayList<>();
      for (int w = 0; w < 2; w++) {
        Random random = new Random(w);
        Thread worker = new Thread(() -> {
          try {
            while (!stop.get()) {
              if (held.size() < 16 && (held.isEmpty() || random.nextBoolean())) {
                // Bounded: a lease lost with the stream would otherwise hang the test.
                held.add(client.leaseAsync(0, BLOCK, false, "resend").get(30, TimeUnit.SECONDS));
              } else {
                Lease lease = held.poll();
                if (lease != null) {
                  lease.close();
                }
              }
              calls.incrementAndGet();
            }
          } catch (Throwable t) {
            synchronized (failures) {
              failures.add(t);
            }
          }
        }, "resend-worker-" + w);
        worker.start();
        workers.add(worker);
      }
      for (int round = 0; round < 30 && failures.isEmpty(); round++) {
        long before = calls.get();
        while (calls.get() < before + 50 && failures.isEmpty()) {
          Thread.sleep(1);
        }
        kill(); // mid-flight: requests and releases go into a dying connection
        startProxy(socket);
      }
      stop.set(true);
      for (Thread worker : workers) {
        worker.join(TimeUnit.SECONDS.toMillis(60));
        assertFalse(worker.isAlive(), "a worker is stuck");
      }
      assertTrue(failures.isEmpty(), () -> "a call failed: " + failures);
      assertFalse(client.sessionLost());
      assertEquals(session, client.sessionId(), "the same session throughout");
      assertTrue(client.messagesResent() > 0, "no message was sent again: the test broke no message in flight");

      // The daemon's books of the session are the client's, once the last notices are applied.
      open = new ArrayList<>(held);
      Set<String> mine = open.stream().map(Lease::id).collect(Collectors.toSet());
      long orphans = client.leaseRepliesLost();
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      Set<String> theirs = daemonLeases(session);
      while (!agree(theirs, mine, orphans) && System.nanoTime() < deadline) {
        Thread.sleep(20);
        theirs = daemonLeases(session);
      }
      Set<String> seen = theirs;
      assertTrue(agree(theirs, mine, orphans), () -> "daemon: " + seen + "; client: " + mine + "; replies lost: "
          + orphans + "; resent: " + client.messagesResent());
      System.out.printf("StreamResendReattachTest: %d calls, %d messages sent again, %d lease replies lost%n",
          calls.get(), client.messagesResent(), orphans);
      open.forEach(Lease::close);
    }
    assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES));
  }

  /**
   * The daemon holds every lease the client holds, and besides only the first grants of leases
   * asked for again after their reply was lost with the connection (unknown to the client).
   */
  private static boolean agree(Set<String> theirs, Set<String> mine, long orphans) {
    return theirs.containsAll(mine) && theirs.size() == mine.size() + orphans;
  }

  private Set<String> daemonLeases(String session) {
    Set<String> ids = new HashSet<>();
    for (LeaseInfo info : AdminGrpc.newBlockingStub(admin.channel())
        .listLeases(ListLeasesRequest.newBuilder().setSessionId(session).setPageSize(5000).build()).getLeasesList()) {
      ids.add(info.getLeaseId());
    }
    return ids;
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
}
