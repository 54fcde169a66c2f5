package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The client cache tier with real processes: a killed client's cached blocks come back with
 * its session; memory one process keeps cached is given back when another needs it; and after
 * mixed use of both paths the daemon's books balance and a trim empties the pool.
 */
class ClientCacheProcessTest {
  private static final long MIB = 1 << 20;

  /** A {@link CacheHolderMain} child process. */
  private static final class Holder implements AutoCloseable {
    final Process process;
    final BufferedReader out;
    final PrintWriter in;

    Holder(String target, String name, int count, long size) throws Exception {
      List<String> command = DaemonProcess.javaCommand(CacheHolderMain.class.getName());
      command.addAll(List.of(target, name, Integer.toString(count), Long.toString(size)));
      process = new ProcessBuilder(command).redirectErrorStream(true).start();
      out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
      in = new PrintWriter(process.getOutputStream(), true, StandardCharsets.UTF_8);
    }

    /** The words of the first output line starting with {@code prefix}. */
    String[] await(String prefix) throws Exception {
      StringBuilder seen = new StringBuilder();
      String line;
      while ((line = out.readLine()) != null) {
        if (line.startsWith(prefix)) {
          return line.split(" ");
        }
        seen.append(line).append('\n');
      }
      throw new AssertionError("holder exited before " + prefix + ":\n" + seen);
    }

    @Override
    public void close() {
      process.destroyForcibly();
    }
  }

  private static DeviceStats stats(GpuMemClient client) {
    return AdminGrpc.newBlockingStub(client.connection().channel())
        .getStats(GetStatsRequest.newBuilder().setDevice(0).build()).getDevices(0);
  }

  private static void assertBalanced(PoolStats s) {
    assertEquals(s.get(PoolMetric.RESERVED_BYTES), s.get(PoolMetric.LEASED_BYTES) + s.get(PoolMetric.CLIENT_CACHED_BYTES)
        + s.get(PoolMetric.CACHED_BYTES) + s.get(PoolMetric.REMAINDER_BYTES) + s.get(PoolMetric.AWAITING_EVENT_BYTES)
        + s.get(PoolMetric.AWAITING_UNMAP_BYTES), "reserved = leased + client cached + cached + remainder + awaiting: " + s);
  }

  @Test
  void sigkilledClient_itsCachedBlocksComeBackWithItsSession() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--keepalive-grace-ms", "300");
         Holder holder = new Holder(daemon.unixTarget(), "doomed", 4, 4 * MIB)) {
      assertEquals(16 * MIB, Long.parseLong(holder.await("READY")[1]), "all four closed leases cached");
      // The client's notices reach the daemon within a millisecond or so.
      long known = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
      while (daemon.server().pools().get(0).stats().get(PoolMetric.CLIENT_CACHED_BYTES) < 16 * MIB
          && System.nanoTime() < known) {
        Thread.sleep(1);
      }
      assertEquals(16 * MIB, daemon.server().pools().get(0).stats().get(PoolMetric.CLIENT_CACHED_BYTES));

      holder.process.destroyForcibly(); // SIGKILL
      assertTrue(holder.process.waitFor(10, TimeUnit.SECONDS));
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (daemon.server().registry().sessionCount() > 0 && System.nanoTime() < deadline) {
        Thread.sleep(20);
      }
      PoolStats s = daemon.server().pools().get(0).stats();
      assertEquals(0, daemon.server().registry().sessionCount());
      assertEquals(0, s.get(PoolMetric.CLIENT_CACHED_BYTES));
      assertEquals(0, s.get(PoolMetric.LEASED_BYTES));
      assertBalanced(s);
      daemon.server().pools().get(0).trim(0);
      assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.RESERVED_BYTES));
    }
  }

  @Test
  void memoryAnotherProcessKeepsCached_isGivenBackWhenNeeded() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--device-limit-bytes", "64MiB", "--client-cache-bytes", "64MiB");
         Holder holder = new Holder(daemon.unixTarget(), "hoarder", 3, 16 * MIB);
         GpuMemClient needy = GpuMemClient.builder(daemon.unixTarget()).clientName("needy").connect()) {
      assertEquals(48 * MIB, Long.parseLong(holder.await("READY")[1]));
      // READY comes when the hoarder has cached them; its notices reach the daemon a moment later,
      // and until then the daemon sees leased blocks it cannot ask back.
      long known = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
      while (daemon.server().pools().get(0).stats().get(PoolMetric.CLIENT_CACHED_BYTES) < 48 * MIB
          && System.nanoTime() < known) {
        Thread.sleep(1);
      }
      // 48 MiB cached by the hoarder, 64 MiB budget: 40 MiB fit only once the hoarder gives back.
      long start = System.nanoTime();
      try (Lease lease = needy.lease(0, 40 * MIB)) {
        long micros = (System.nanoTime() - start) / 1000;
        assertEquals(40 * MIB, lease.sizeBytes());
        System.out.println("pressure lease served in " + micros + " us");
      }
      holder.in.println("stats");
      String[] stats = holder.await("STATS");
      assertEquals(0, Long.parseLong(stats[3]), "the hoarder gave back its cached blocks");
      assertTrue(Long.parseLong(stats[4]) >= 3, "by releasing them: " + String.join(" ", stats));
      assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.OOMS));
      assertBalanced(daemon.server().pools().get(0).stats());
    }
  }

  @Test
  void mixedUseOfBothPaths_keepsTheBooksBalanced_andATrimEmptiesThePool() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--client-cache-bytes", "8MiB");
         GpuMemClient cached = GpuMemClient.builder(daemon.unixTarget()).clientName("cached").connect();
         GpuMemClient streamOnly = GpuMemClient.builder(daemon.unixTarget()).clientName("stream").clientCacheBytes(0).connect();
         GpuMemClient unary = GpuMemClient.builder(daemon.unixTarget()).clientName("unary").unaryCalls(true).connect()) {
      GpuMemClient[] clients = {cached, streamOnly, unary};
      SplittableRandom random = new SplittableRandom(2026);
      List<Lease> open = new ArrayList<>();
      for (int step = 0; step < 3000; step++) {
        if (open.isEmpty() || (open.size() < 40 && random.nextInt(3) > 0)) {
          long size = random.nextInt(4) == 0 ? random.nextLong(1, 6 * MIB) : random.nextLong(1, 256 * 1024);
          open.add(clients[random.nextInt(3)].lease(0, size, random.nextInt(8) == 0, "mixed"));
        } else {
          open.remove(random.nextInt(open.size())).close();
        }
        if (step % 500 == 0) {
          assertBalanced(daemon.server().pools().get(0).stats());
          daemon.verifyInvariants();
        }
      }
      open.forEach(Lease::close);
      assertTrue(cached.stats().localHits() > 0, "the cached client served some leases locally: " + cached.stats());
      assertEquals(0, streamOnly.stats().localHits());
      // Releases are notices: wait until the daemon has seen them all.
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES) > 0 && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      PoolStats s = daemon.server().pools().get(0).stats();
      assertEquals(0, s.get(PoolMetric.LEASED_BYTES));
      assertEquals(cached.stats().cachedBytes(), s.get(PoolMetric.CLIENT_CACHED_BYTES));
      assertBalanced(s);
      DeviceStats viaAdmin = stats(cached);
      assertEquals(cached.stats().localHits(), viaAdmin.getClientCacheHits(), "the client's hits reached the daemon");

      AdminGrpc.newBlockingStub(cached.connection().channel()).trim(TrimRequest.newBuilder().setDevice(0).setKeepBytes(0).build());
      deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (daemon.server().pools().get(0).stats().get(PoolMetric.RESERVED_BYTES) > 0 && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.RESERVED_BYTES),
          "a trim returns the pool to zero: " + daemon.server().pools().get(0).stats());
      daemon.verifyInvariants();
    }
  }
}
