package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.server.testing.TestDaemon;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Soak: 100 client processes, in ten waves of ten, each holding five leases, SIGKILLed while
 * they hold them. After every wave all of the wave's leases are back within the grace period
 * plus a second, a survivor's leases and bytes are untouched, and at the end the books balance:
 * nothing leased but the survivor's, and the pools' invariants hold.
 */
class KillWavesSoakTest {
  private static final int WAVES = 10;
  private static final int PER_WAVE = 10;
  private static final long GRACE_MS = 500;

  @Test
  void hundredClientsKilledInWaves_loseNothing() throws Exception {
    try (TestDaemon daemon = TestDaemon.start("--keepalive-grace-ms", Long.toString(GRACE_MS));
         GpuMemClient survivor = GpuMemClient.builder(daemon.unixTarget()).clientName("survivor").connect()) {
      List<Lease> kept = new ArrayList<>();
      for (int i = 0; i < 4; i++) {
        Lease lease = survivor.lease(i % 2, 100_000 * (i + 1), false, "kept");
        LeaseHolderMain.fill(lease.buffer(), (byte) (0x10 + i));
        kept.add(lease);
      }
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(survivor.connection().channel());
      for (int wave = 1; wave <= WAVES; wave++) {
        List<Process> holders = new ArrayList<>();
        for (int i = 0; i < PER_WAVE; i++) {
          holders.add(ProcessKillTest.startHolder(daemon.unixTarget(), "wave-" + wave + "-" + i, 5, 64_000 + 4096L * i));
        }
        for (Process holder : holders) {
          assertEquals(5, ProcessKillTest.awaitReady(holder).size());
        }
        assertEquals(kept.size() + 5 * PER_WAVE, leases(admin), "wave " + wave + " holds its leases");
        for (Process holder : holders) {
          holder.destroyForcibly(); // SIGKILL
        }
        for (Process holder : holders) {
          assertTrue(holder.waitFor(10, TimeUnit.SECONDS));
        }
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(GRACE_MS + 1000);
        while (leases(admin) != kept.size() && System.nanoTime() < deadline) {
          Thread.sleep(20);
        }
        assertEquals(kept.size(), leases(admin), "wave " + wave + ": every killed client's lease is back within grace + 1 s");
        for (int i = 0; i < kept.size(); i++) {
          assertTrue(LeaseHolderMain.holds(kept.get(i).buffer(), (byte) (0x10 + i)), "the survivor's bytes, wave " + wave);
        }
      }
      long keptBytes = kept.stream().mapToLong(Lease::blockBytes).sum();
      long leased = 0;
      for (DeviceStats d : admin.getStats(GetStatsRequest.getDefaultInstance()).getDevicesList()) {
        leased += d.getLeasedBytes();
      }
      assertEquals(keptBytes, leased, "0 bytes lost: only the survivor's blocks are leased");
      daemon.verifyInvariants();
      kept.forEach(Lease::close);
    }
  }

  private static int leases(AdminGrpc.AdminBlockingStub admin) {
    return admin.listLeases(ListLeasesRequest.getDefaultInstance()).getLeasesCount();
  }
}
