package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.OpenSessionResponse;
import io.gpumemd.server.testing.TestDaemon;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A daemon started with a non-default {@code --max-oversize-bytes} and its clients agree: the
 * daemon tells the rule in OpenSessionResponse, and the client cache tier serves the same
 * requests from a cached block that the daemon's own cache would (with the default rule of
 * 20 MiB, the client would take a block the daemon never would).
 */
class OversizeAgreementTest {
  private static final long MiB = 1 << 20;
  private TestDaemon daemon;

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--max-oversize-bytes", "4MiB", "--client-cache-bytes", "64MiB");
  }

  @AfterEach
  void stop() {
    daemon.verifyInvariants();
    daemon.close();
  }

  @Test
  void openSession_tellsTheDaemonsOversizeRule() {
    try (Channels.Connection connection = Channels.open(daemon.unixTarget())) {
      AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(connection.channel());
      OpenSessionResponse opened = allocator.openSession(OpenSessionRequest.getDefaultInstance());
      assertTrue(opened.hasMaxOversizeBytes());
      assertEquals(4 * MiB, opened.getMaxOversizeBytes());
      allocator.closeSession(CloseSessionRequest.newBuilder().setSessionId(opened.getSessionId()).build());
    }
  }

  @Test
  void theClientCache_takesTheBlocksTheDaemonWould() {
    // 16 MiB cached, then 10 MiB (16 is 6 MiB over it: not used) and 14 MiB (2 MiB over: used).
    List<Boolean> daemonHits = hits(GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0), 0, false);
    List<Boolean> clientHits = hits(GpuMemClient.builder(daemon.unixTarget()), 1, true);
    assertEquals(List.of(false, true), daemonHits, "the daemon's cache under --max-oversize-bytes 4MiB");
    assertEquals(daemonHits, clientHits, "the client cache applies the daemon's rule, not the default");
  }

  /**
   * Leases 16 MiB and closes it (into the daemon's cache, or the client's), then leases 10 MiB
   * and 14 MiB; for each of the two, whether it was served from that cache.
   */
  private static List<Boolean> hits(GpuMemClient.Builder builder, int device, boolean clientCache) {
    List<Boolean> hits = new ArrayList<>();
    try (GpuMemClient client = builder.connect()) {
      client.lease(device, 16 * MiB).close();
      for (long size : new long[] {10 * MiB, 14 * MiB}) {
        try (Lease lease = client.lease(device, size)) {
          hits.add(clientCache ? lease.localHit() : lease.poolHit());
          if (!clientCache) {
            assertFalse(lease.localHit(), lease.toString());
          }
        }
      }
    }
    return hits;
  }
}
