package io.gpumemd.it.bench;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The daemon's memory: idle RSS and heap, then heap per outstanding lease while many sessions
 * hold {@code LEASES} small leases. Starts the daemon as its own JVM (a 4 GiB sparse host
 * device, so the leases fit), measures it with {@code jcmd} after a full GC, and prints a
 * table. Run:
 *
 * <pre>
 * mvn -B -q -pl it -am package -DskipTests dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -Xmx3g -cp "it/target/test-classes:$(cat it/target/test-classpath.txt)" \
 *     io.gpumemd.it.bench.MemoryFootprintMain 1000000 100
 * </pre>
 */
public final class MemoryFootprintMain {
  private MemoryFootprintMain() {}

  public static void main(String[] args) throws Exception {
    int leases = args.length > 0 ? Integer.parseInt(args[0]) : 1_000_000;
    int sessions = args.length > 1 ? Integer.parseInt(args[1]) : 100;
    System.setProperty("gpumemd.test.xmx", "2g");
    DaemonProcess daemon = DaemonProcess.start("--host-devices", "1", "--host-device-bytes", "4GiB",
        "--keepalive-grace-ms", "60000");
    long pid = daemon.process().pid();
    try {
      Thread.sleep(2000);
      long idleHeap = heapUsedAfterGc(pid);
      long idleRss = rss(pid);
      List<GpuMemClient> clients = new ArrayList<>();
      List<Lease> held = new ArrayList<>(leases);
      for (int s = 0; s < sessions; s++) {
        clients.add(GpuMemClient.builder(daemon.unixTarget()).clientName("holder-" + s).connect());
      }
      Semaphore window = new Semaphore(256);
      List<CompletableFuture<Lease>> futures = new ArrayList<>(leases);
      for (int i = 0; i < leases; i++) {
        window.acquire();
        CompletableFuture<Lease> f = clients.get(i % sessions).leaseAsync(0, 512, false, "");
        f.whenComplete((l, e) -> window.release());
        futures.add(f);
      }
      for (CompletableFuture<Lease> f : futures) {
        held.add(f.join());
      }
      futures.clear();
      long fullHeap = heapUsedAfterGc(pid);
      long fullRss = rss(pid);
      System.out.printf("%-44s %12s%n", "daemon (host backend, " + sessions + " sessions)", "value");
      System.out.printf("%-44s %9.1f MiB%n", "idle heap after GC", idleHeap / 1048576.0);
      System.out.printf("%-44s %9.1f MiB%n", "idle RSS", idleRss / 1048576.0);
      System.out.printf("%-44s %9.1f MiB%n", "heap after GC with " + leases + " leases", fullHeap / 1048576.0);
      System.out.printf("%-44s %9.1f MiB%n", "RSS with " + leases + " leases", fullRss / 1048576.0);
      System.out.printf("%-44s %9.0f B%n", "heap per outstanding lease", (fullHeap - idleHeap) / (double) leases);
      clients.forEach(GpuMemClient::close);
    } finally {
      daemon.terminate(60_000);
      daemon.close();
    }
  }

  private static String jcmd(long pid, String command) throws IOException, InterruptedException {
    Path jcmd = Path.of(System.getProperty("java.home"), "bin", "jcmd");
    Process p = new ProcessBuilder(jcmd.toString(), Long.toString(pid), command).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    p.waitFor();
    return out;
  }

  /** Heap in use after a full GC, from {@code jcmd GC.heap_info} ("used NNNK"). */
  private static long heapUsedAfterGc(long pid) throws Exception {
    jcmd(pid, "GC.run");
    Thread.sleep(500);
    Matcher m = Pattern.compile("total \\d+K, used (\\d+)K").matcher(jcmd(pid, "GC.heap_info"));
    long used = 0;
    while (m.find()) {
      used += Long.parseLong(m.group(1)) * 1024;
    }
    return used;
  }

  private static long rss(long pid) throws IOException {
    for (String line : Files.readAllLines(Path.of("/proc", Long.toString(pid), "status"))) {
      if (line.startsWith("VmRSS:")) {
        return Long.parseLong(line.replaceAll("\\D", "")) * 1024;
      }
    }
    return -1;
  }
}
