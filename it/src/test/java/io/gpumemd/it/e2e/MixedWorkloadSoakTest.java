package io.gpumemd.it.e2e;

import io.gpumemd.server.auth.Caller;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestChannel;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/**
 * Soak: eight client processes ({@link MixedWorkloadMain}) run a random mix against one daemon
 * for 40 s by default (-Dgpumemd.soak.seconds=N sets it): leases of 512 B to 4 MiB, zeroed ones
 * checked for zeros, per-lease patterns written and checked while held, releases, several
 * blocks held at once, clients closed and opened again over the Unix socket or TCP, on the
 * session stream or the unary calls, sync and async; three of the processes are SIGKILLed
 * while they hold leases and replaced. Throughout, health over the Unix socket answers SERVING,
 * GetStats' books add up within the limit and the pools' invariants hold (every ~500 ms).
 * Afterwards: no corrupted byte in any process (killed ones included), the work was done,
 * every session is gone within the grace period, nothing is leased, the invariants hold and
 * there is one file per live segment.
 */
class MixedWorkloadSoakTest {
  private static final int PROCESSES = 8;
  private static final int KILLS = 3;
  private static final long GRACE_MS = 500;
  private static final long SECONDS = Long.getLong("gpumemd.soak.seconds", 40);

  /** One client process and everything it printed. */
  private static final class Child {
    final String name;
    final Process process;
    final List<String> lines = Collections.synchronizedList(new ArrayList<>());
    final AtomicBoolean started = new AtomicBoolean();
    final Thread pump;

    Child(String name, Process process) {
      this.name = name;
      this.process = process;
      pump = new Thread(() -> {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
          String line;
          while ((line = in.readLine()) != null) {
            lines.add(line);
            if (line.equals("STARTED")) {
              started.set(true);
            }
          }
        } catch (IOException e) {
          // the process ended
        }
      }, "out-" + name);
      pump.setDaemon(true);
      pump.start();
    }

    String output() {
      synchronized (lines) {
        return name + ":\n" + String.join("\n", lines);
      }
    }

    List<String> corruptions() {
      synchronized (lines) {
        return lines.stream().filter(l -> l.startsWith("CORRUPT")).toList();
      }
    }
  }

  private static Child start(TestDaemon daemon, String name, long seed, long millis) throws IOException {
    List<String> command = DaemonProcess.javaCommand(MixedWorkloadMain.class.getName());
    command.addAll(List.of(daemon.unixTarget(), daemon.tcpTarget(), name, Long.toString(seed), Long.toString(millis)));
    return new Child(name, new ProcessBuilder(command).redirectErrorStream(true).start());
  }

  @Test
  void eightProcesses_mixedRandomWork_noCorruption_booksBalance() throws Exception {
    assertTrue(SECONDS >= 10, "gpumemd.soak.seconds: at least 10, not " + SECONDS);
    long runNanos = TimeUnit.SECONDS.toNanos(SECONDS);
    List<Child> all = new ArrayList<>();
    List<String> monitorFailures = Collections.synchronizedList(new ArrayList<>());
    AtomicLong polls = new AtomicLong();
    try (TestDaemon daemon = TestDaemon.start("--keepalive-grace-ms", Long.toString(GRACE_MS),
             "--host-segments", "path"); // counts segment files
         TestChannel probe = new TestChannel(daemon.unixTarget())) {
      long begin = System.nanoTime();
      long end = begin + runNanos;
      Child[] slots = new Child[PROCESSES];
      for (int i = 0; i < PROCESSES; i++) {
        slots[i] = start(daemon, "mixed-" + i, 1000 + i, TimeUnit.NANOSECONDS.toMillis(runNanos));
        all.add(slots[i]);
      }

      // The monitor: health over the Unix socket, the books as GetStats has them, the pools'
      // invariants, every ~500 ms while the workload runs.
      AtomicBoolean stop = new AtomicBoolean();
      HealthGrpc.HealthBlockingStub health = HealthGrpc.newBlockingStub(probe.channel());
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(probe.channel());
      Thread monitor = new Thread(() -> {
        while (!stop.get() && monitorFailures.size() < 20) {
          try {
            HealthCheckResponse.ServingStatus status = health.withDeadlineAfter(10, TimeUnit.SECONDS)
                .check(HealthCheckRequest.newBuilder().setService("gpumemd.v1.Allocator").build()).getStatus();
            if (status != HealthCheckResponse.ServingStatus.SERVING) {
              monitorFailures.add("health: " + status);
            }
            for (DeviceStats d : admin.withDeadlineAfter(10, TimeUnit.SECONDS)
                .getStats(GetStatsRequest.getDefaultInstance()).getDevicesList()) {
              DeviceBooks.assertBalanced(d);
            }
            daemon.verifyInvariants();
            polls.incrementAndGet();
          } catch (Throwable t) {
            if (!stop.get()) { // not a call cut short by the interrupt that stops the monitor
              monitorFailures.add(t.toString());
            }
          }
          try {
            Thread.sleep(500);
          } catch (InterruptedException e) {
            return;
          }
        }
      }, "monitor");
      monitor.start();

      // Three processes SIGKILLed (each once it holds leases) at a quarter, half and three
      // quarters of the run, each replaced by a new one for the rest of the run.
      int killed = 0;
      for (int k = 1; k <= KILLS; k++) {
        long at = begin + runNanos * k / (KILLS + 1);
        while (System.nanoTime() < at) {
          Thread.sleep(50);
        }
        int slot = (k * 3) % PROCESSES;
        Child victim = slots[slot];
        long startedBy = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (!victim.started.get() && victim.process.isAlive() && System.nanoTime() < startedBy) {
          Thread.sleep(20);
        }
        assertTrue(victim.started.get(), "never leased:\n" + victim.output());
        victim.process.destroyForcibly(); // SIGKILL
        assertTrue(victim.process.waitFor(10, TimeUnit.SECONDS));
        killed++;
        long left = TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime());
        // At least 5 s: a JVM on a busy machine takes a while to start.
        slots[slot] = start(daemon, "mixed-" + slot + "-after-kill-" + k, 2000 + k, Math.max(5000, left));
        all.add(slots[slot]);
      }

      Map<String, Long> totals = new HashMap<>();
      List<Map<String, Long>> results = new ArrayList<>();
      for (Child child : slots) {
        assertTrue(child.process.waitFor(runNanos / 1_000_000_000L + 60, TimeUnit.SECONDS), "did not end:\n" + child.output());
        child.pump.join(5000);
        assertEquals(0, child.process.exitValue(), child.output());
        String line = child.lines.stream().filter(l -> l.startsWith("RESULT ")).findFirst()
            .orElseThrow(() -> new AssertionError("no RESULT line:\n" + child.output()));
        Map<String, Long> r = new HashMap<>();
        for (String kv : line.substring("RESULT ".length()).split(" ")) {
          String[] pair = kv.split("=", 2);
          r.put(pair[0], Long.parseLong(pair[1]));
          totals.merge(pair[0], Long.parseLong(pair[1]), Long::sum);
        }
        results.add(r);
      }
      stop.set(true);
      monitor.interrupt();
      monitor.join(15_000);
      System.out.println("mixed workload soak, " + SECONDS + " s: " + totals + ", " + killed + " killed, " + polls.get()
          + " monitor polls");

      // No process saw a corrupted byte, the killed ones included.
      List<String> corrupt = new ArrayList<>();
      all.forEach(c -> corrupt.addAll(c.corruptions()));
      assertEquals(List.of(), corrupt);
      assertEquals(0L, totals.get("corruptions"));
      // The work was done, all of the mix. (Bounds far below what any machine does: they show
      // that the processes worked, not how fast.)
      for (int i = 0; i < PROCESSES; i++) {
        assertTrue(results.get(i).get("ops") >= 20, "little work: " + results.get(i) + "\n" + slots[i].output());
        assertTrue(results.get(i).get("checks") > 0, slots[i].output());
      }
      assertTrue(totals.get("ops") >= 500, "little work: " + totals);
      for (String kind : List.of("zero", "async", "unary", "stream", "reopens")) {
        assertTrue(totals.get(kind) > 0, "no " + kind + " in " + totals);
      }
      assertEquals(KILLS, killed);
      assertTrue(polls.get() >= 5, "monitor polls: " + polls.get());
      assertEquals(List.of(), monitorFailures, "health, books or invariants during the run");

      // Every session ends: closed by its process, or the killed ones' after the grace period.
      // A process killed between OpenSession and its stream's first message leaves a session
      // that never had a stream: that one ends when its TTL runs out (30 s by default), so it
      // may outlast the grace, but only without a stream.
      long settle = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(GRACE_MS + 5000);
      while (!daemon.server().registry().sessions(Caller.DAEMON).isEmpty() && System.nanoTime() < settle) {
        Thread.sleep(20);
      }
      List<Session> left = daemon.server().registry().sessions(Caller.DAEMON);
      for (Session session : left) {
        assertFalse(session.streamAttached(), "a session with a stream outlived the grace: " + session);
      }
      settle = System.nanoTime() + TimeUnit.SECONDS.toNanos(30 + 5);
      while (!daemon.server().registry().sessions(Caller.DAEMON).isEmpty() && System.nanoTime() < settle) {
        Thread.sleep(50);
      }
      assertEquals(List.of(), daemon.server().registry().sessions(Caller.DAEMON), "sessions left (first check: " + left + ")");
      assertEquals(0, daemon.server().registry().liveLeases());
      for (DevicePool pool : daemon.server().pools().all()) {
        pool.verifyInvariants();
        PoolStats s = pool.stats();
        assertEquals(0, s.get(PoolMetric.LEASED_BYTES), "device " + s.device());
        assertEquals(0, s.get(PoolMetric.CLIENT_CACHED_BYTES), "device " + s.device());
        assertEquals(0, s.get(PoolMetric.ACTIVE_LEASES), "device " + s.device());
        assertEquals(0, s.get(PoolMetric.SEGMENTS_AWAITING_UNMAP), "segments of ended sessions are freed");
        assertEquals(s.get(PoolMetric.SEGMENTS), daemon.segmentFiles(s.device()), "one file per live segment");
      }
      assertEquals(HealthCheckResponse.ServingStatus.SERVING, health.withDeadlineAfter(10, TimeUnit.SECONDS)
          .check(HealthCheckRequest.newBuilder().setService("gpumemd.v1.Allocator").build()).getStatus());
    } finally {
      all.forEach(c -> c.process.destroyForcibly());
    }
  }
}
