package io.gpumemd.it.e2e;

import io.gpumemd.client.ClientStats;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

/**
 * A client process for end-to-end tests of the client cache tier: leases {@code count} blocks
 * of {@code size} bytes on device 0, closes them (into its cache, within its allowance), prints
 * {@code READY <cached bytes>} and then keeps running, obeying the daemon's events, until it is
 * killed or its stdin closes. Each line {@code stats} on stdin is answered with {@code STATS
 * <local hits> <local returns> <cached bytes> <releases>}.
 *
 * <p>Usage: {@code CacheHolderMain target clientName count size}
 */
public final class CacheHolderMain {
  private CacheHolderMain() {}

  public static void main(String[] args) throws Exception {
    int count = Integer.parseInt(args[2]);
    long size = Long.parseLong(args[3]);
    try (GpuMemClient client = GpuMemClient.builder(args[0]).clientName(args[1]).connect()) {
      Lease[] leases = new Lease[count];
      for (int i = 0; i < count; i++) {
        leases[i] = client.lease(0, size, false, "cached-" + i);
      }
      for (Lease lease : leases) {
        lease.close();
      }
      System.out.println("READY " + client.stats().cachedBytes());
      System.out.flush();
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      String line;
      while ((line = in.readLine()) != null) {
        if (line.equals("stats")) {
          ClientStats s = client.stats();
          System.out.println("STATS " + s.localHits() + " " + s.localReturns() + " " + s.cachedBytes() + " " + s.releases());
          System.out.flush();
        }
      }
    }
  }
}
