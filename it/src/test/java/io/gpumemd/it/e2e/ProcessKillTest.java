package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.LeaseInfo;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestDaemon;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * A client JVM killed with SIGKILL loses nothing for the others: its leases come back within
 * the grace period plus a second, and another client's leases and bytes are untouched.
 */
class ProcessKillTest {

  static Process startHolder(String target, String name, int count, long size) throws Exception {
    List<String> command = DaemonProcess.javaCommand(LeaseHolderMain.class.getName());
    command.addAll(List.of(target, name, Integer.toString(count), Long.toString(size)));
    return new ProcessBuilder(command).redirectErrorStream(true).start();
  }

  static List<String> awaitReady(Process holder) throws Exception {
    BufferedReader out = new BufferedReader(new InputStreamReader(holder.getInputStream(), StandardCharsets.UTF_8));
    StringBuilder seen = new StringBuilder();
    String line;
    while ((line = out.readLine()) != null) {
      if (line.startsWith("READY")) {
        List<String> ids = new ArrayList<>(List.of(line.substring(5).trim().split(" ")));
        ids.removeIf(String::isEmpty);
        return ids;
      }
      seen.append(line).append('\n');
    }
    throw new AssertionError("holder exited before READY:\n" + seen);
  }

  @Test
  void sigkilledClient_leasesReturnWithinGracePlusOneSecond_othersUntouched() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--keepalive-grace-ms", "500");
         GpuMemClient survivor = GpuMemClient.builder(daemon.unixTarget()).clientName("survivor").connect()) {
      List<Lease> kept = new ArrayList<>();
      for (int i = 0; i < 3; i++) {
        Lease lease = survivor.lease(i % 2, 300_000, false, "kept");
        LeaseHolderMain.fill(lease.buffer(), (byte) (0x10 + i));
        kept.add(lease);
      }
      long keptBytes = kept.stream().mapToLong(Lease::blockBytes).sum();
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(survivor.connection().channel());

      Process holder = startHolder(daemon.unixTarget(), "victim", 5, 200_000);
      try {
        List<String> victimIds = awaitReady(holder);
        assertEquals(5, victimIds.size());
        assertEquals(8, admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesCount());

        holder.destroyForcibly(); // SIGKILL
        assertTrue(holder.waitFor(10, TimeUnit.SECONDS));
        long killedAt = System.nanoTime();
        long deadline = killedAt + TimeUnit.MILLISECONDS.toNanos(500 + 1000);
        while (admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesCount() != 3
            && System.nanoTime() < deadline) {
          Thread.sleep(20);
        }
        List<LeaseInfo> left = admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesList();
        Set<String> leftIds = left.stream().map(LeaseInfo::getLeaseId).collect(Collectors.toSet());
        assertEquals(kept.stream().map(Lease::id).collect(Collectors.toSet()), leftIds,
            "only the survivor's leases remain " + (System.nanoTime() - killedAt) / 1_000_000 + " ms after the kill");
        long leased = admin.getStats(GetStatsRequest.getDefaultInstance()).getDevicesList().stream()
            .mapToLong(d -> d.getLeasedBytes()).sum();
        assertEquals(keptBytes, leased);
        assertEquals(1, admin.listSessions(io.gpumemd.proto.v1.ListSessionsRequest.getDefaultInstance()).getSessionsCount());
        for (int i = 0; i < kept.size(); i++) {
          assertTrue(LeaseHolderMain.holds(kept.get(i).buffer(), (byte) (0x10 + i)), "survivor's bytes of lease " + i);
        }
        daemon.verifyInvariants();
      } finally {
        holder.destroyForcibly();
      }
      kept.forEach(Lease::close);
    }
  }
}
