package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestChannel;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * Soak: a real daemon process is restarted ten times on the same socket and shm-dir (SIGTERM
 * and SIGKILL in turn) under a running worker process ({@link RestartWorkerMain}) that leases,
 * writes a pattern, checks it and releases. The worker carries on: it exits 0 having done every
 * iteration, with no corrupted byte; each of the eleven daemon generations served iterations on
 * its own session; once an iteration ran on a newer daemon none ran on an older one; and the
 * final daemon's books balance: no session, nothing leased, reserved = leased + client-cached +
 * cached + remainder + awaiting event + awaiting unmap, within the limit, one segment file per
 * segment.
 */
class RestartSoakTest {
  private static final int RESTARTS = 10;
  private static final int PER_GENERATION = 8;
  private static final int ITERATIONS = (RESTARTS + 1) * PER_GENERATION;
  private static final String WORKER = "restart-worker";
  private static final Pattern ITER = Pattern.compile("^ITER (\\d+) session=(\\S+) lease=(\\S+)$");

  private record Iteration(int n, String session, String lease) {}

  @Test
  void tenRestartsUnderARunningWorker_workerCarriesOn_booksBalance() throws Exception {
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-restart-soak-");
    DaemonProcess daemon = DaemonProcess.startIn(dir, "--host-segments", "path"); // counts segment files
    List<String> output = Collections.synchronizedList(new ArrayList<>());
    List<Iteration> iterations = Collections.synchronizedList(new ArrayList<>());
    List<String> command = DaemonProcess.javaCommand(RestartWorkerMain.class.getName());
    command.addAll(List.of(daemon.unixTarget(), WORKER, Integer.toString(ITERATIONS), "20"));
    Process worker = new ProcessBuilder(command).redirectErrorStream(true).start();
    Thread pump = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(worker.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          output.add(line);
          Matcher m = ITER.matcher(line);
          if (m.matches()) {
            iterations.add(new Iteration(Integer.parseInt(m.group(1)), m.group(2), m.group(3)));
          }
        }
      } catch (IOException e) {
        // the worker ended
      }
    }, "worker-output");
    pump.setDaemon(true);
    pump.start();
    OutputStream gate = worker.getOutputStream();
    // Sessions of the worker each daemon generation had, as that daemon listed them.
    List<Set<String>> generations = new ArrayList<>();
    try {
      int allowed = 0;
      for (int generation = 0; generation <= RESTARTS; generation++) {
        allowed += PER_GENERATION;
        gate.write((allowed + "\n").getBytes(StandardCharsets.UTF_8));
        gate.flush();
        Set<String> sessions = new HashSet<>();
        try (TestChannel channel = new TestChannel(daemon.unixTarget())) {
          AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(channel.channel());
          String context = "generation " + generation;
          await(() -> sessions.addAll(workerSessions(admin)) || !sessions.isEmpty(), context
              + ": the worker opened no session on this daemon", worker, output);
          // Half of the generation's iterations done on this daemon, then the restart meets the
          // worker in the middle of the other half.
          await(() -> {
            sessions.addAll(workerSessions(admin));
            return countOn(iterations, sessions) >= PER_GENERATION / 2;
          }, context + ": the worker did not go on on this daemon", worker, output);
          sessions.addAll(workerSessions(admin));
          generations.add(sessions);
          if (generation == RESTARTS) {
            break;
          }
        }
        if (generation % 2 == 0) {
          daemon.process().destroyForcibly(); // SIGKILL
          assertTrue(daemon.process().waitFor(10, TimeUnit.SECONDS));
        } else {
          assertEquals(0, daemon.terminate(20_000), "SIGTERM exit of generation " + generation + "\n" + daemon.output());
        }
        daemon.close();
        daemon = DaemonProcess.startIn(dir, "--host-segments", "path"); // counts segment files
      }
      gate.write((ITERATIONS + "\n").getBytes(StandardCharsets.UTF_8));
      gate.flush();
      assertTrue(worker.waitFor(60, TimeUnit.SECONDS), "the worker did not end:\n" + String.join("\n", output));
      pump.join(5000);
      String log = String.join("\n", output);
      assertEquals(0, worker.exitValue(), log);

      // The worker did every iteration, once each, in order, with no corrupted byte.
      String result = output.stream().filter(l -> l.startsWith("RESULT ")).findFirst().orElse(null);
      assertNotNull(result, "no RESULT line:\n" + log);
      Map<String, String> r = parse(result);
      assertEquals(Integer.toString(ITERATIONS), r.get("iterations"), log);
      assertEquals("0", r.get("corruptions"), log);
      assertTrue(output.stream().noneMatch(l -> l.startsWith("CORRUPT")), log);
      // Besides a draining daemon's refusals, a restart costs a retrying worker a few failed
      // attempts (the lease in flight, the lease held across it), not a spin through the grace
      // period.
      assertTrue(Long.parseLong(r.get("retries")) <= 3L * RESTARTS, r.get("retries") + " retries:\n" + log);
      List<Iteration> done = List.copyOf(iterations);
      assertEquals(ITERATIONS, done.size(), log);
      for (int i = 0; i < done.size(); i++) {
        assertEquals(i + 1, done.get(i).n(), "iterations out of order:\n" + log);
      }

      // Every iteration ran on a session of a known daemon generation; each generation served
      // iterations; and after the first iteration on a newer daemon, none ran on an older one.
      Map<String, Integer> generationOf = new HashMap<>();
      for (int g = 0; g < generations.size(); g++) {
        for (String s : generations.get(g)) {
          assertEquals(null, generationOf.put(s, g), "session " + s + " listed by two daemons");
        }
      }
      assertEquals(RESTARTS + 1, generations.size());
      int[] perGeneration = new int[RESTARTS + 1];
      int last = 0;
      for (Iteration it : done) {
        Integer g = generationOf.get(it.session());
        assertNotNull(g, "iteration " + it.n() + " ran on a session no daemon listed: " + it.session() + "\n" + log);
        assertTrue(g >= last, "iteration " + it.n() + " ran on generation " + g + " after generation " + last + "\n" + log);
        last = g;
        perGeneration[g]++;
      }
      System.out.println("restart soak: " + ITERATIONS + " iterations, " + r.get("retries") + " retried, "
          + r.get("draining") + " refused while draining, per daemon "
          + java.util.Arrays.toString(perGeneration));
      for (int g = 0; g <= RESTARTS; g++) {
        assertTrue(perGeneration[g] >= PER_GENERATION / 2, "generation " + g + " served " + perGeneration[g]
            + " iterations\n" + log);
        assertEquals(1, generations.get(g).size(), "generation " + g + ": the worker needed one session, not "
            + generations.get(g));
      }

      // The final daemon: the worker closed its session; nothing leased; the books balance.
      try (TestChannel channel = new TestChannel(daemon.unixTarget())) {
        AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(channel.channel());
        await(() -> admin.listSessions(ListSessionsRequest.getDefaultInstance()).getSessionsCount() == 0,
            "sessions left on the final daemon", null, output);
        for (DeviceStats d : admin.getStats(GetStatsRequest.getDefaultInstance()).getDevicesList()) {
          DeviceBooks.assertBalanced(d);
          assertEquals(0, d.getLeasedBytes(), "device " + d.getDevice());
          assertEquals(0, d.getActiveLeases(), "device " + d.getDevice());
          assertEquals(0, d.getClientCachedBytes(), "device " + d.getDevice());
          assertEquals(d.getSegments(), segmentFiles(daemon.shmDir(), d.getDevice()),
              "device " + d.getDevice() + ": one file per live segment, none left by earlier daemons");
        }
      }
      assertEquals(0, daemon.terminate(20_000), daemon.output());
    } finally {
      worker.destroyForcibly();
      synchronized (output) {
        Files.write(Path.of("target", "restart-soak-worker.log"), output); // for a failure's post-mortem
      }
      daemon.close();
      try (Stream<Path> walk = Files.walk(dir)) {
        walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  private static Set<String> workerSessions(AdminGrpc.AdminBlockingStub admin) {
    return admin.withDeadlineAfter(5, TimeUnit.SECONDS).listSessions(ListSessionsRequest.getDefaultInstance())
        .getSessionsList().stream().filter(s -> s.getClientName().equals(WORKER)).map(SessionInfo::getSessionId)
        .collect(Collectors.toSet());
  }

  private static int countOn(List<Iteration> iterations, Set<String> sessions) {
    synchronized (iterations) {
      return (int) iterations.stream().filter(i -> sessions.contains(i.session())).count();
    }
  }

  private static long segmentFiles(Path shmDir, int device) throws IOException {
    Path dev = shmDir.resolve("dev" + device);
    if (!Files.isDirectory(dev)) {
      return 0;
    }
    try (Stream<Path> files = Files.list(dev)) {
      return files.filter(p -> p.getFileName().toString().startsWith("seg-")).count();
    }
  }

  private static Map<String, String> parse(String line) {
    Map<String, String> result = new HashMap<>();
    for (String kv : line.substring("RESULT".length()).trim().split(" ")) {
      String[] pair = kv.split("=", 2);
      result.put(pair[0], pair[1]);
    }
    return result;
  }

  /**
   * Waits (up to 30 s, or until the worker, when given, has ended) for {@code condition}; fails
   * with the worker's output if it never holds.
   */
  private static void await(BooleanSupplier condition, String failure, Process worker, List<String> output)
      throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (System.nanoTime() < deadline) {
      if (condition.getAsBoolean()) {
        return;
      }
      if (worker != null && !worker.isAlive() && !condition.getAsBoolean()) {
        break;
      }
      Thread.sleep(20);
    }
    throw new AssertionError(failure + "\n" + String.join("\n", output));
  }
}
