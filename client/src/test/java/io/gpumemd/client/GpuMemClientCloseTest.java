package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.TestDaemon;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * {@link GpuMemClient#close()} is idempotent, also when several threads call it at once (a
 * worker's shutdown hook racing its main thread): whichever call returns, the client is closed
 * by then (its mappings are gone and the daemon has ended the session).
 */
class GpuMemClientCloseTest {
  private static final int CLOSERS = 4;
  private static final int ROUNDS = 20;
  private static TestDaemon daemon;

  @BeforeAll
  static void start() {
    daemon = TestDaemon.start();
  }

  @AfterAll
  static void stop() {
    daemon.close();
  }

  @Test
  void concurrentCloses_allReturnWithTheClientClosed() throws Exception {
    ExecutorService threads = Executors.newFixedThreadPool(CLOSERS);
    try {
      for (int round = 0; round < ROUNDS; round++) {
        GpuMemClient client = GpuMemClient.connect(daemon.unixTarget());
        client.lease(0, 4096).close(); // the segment stays mapped in the client's cache
        assertEquals(1, client.mappedSegments());
        CyclicBarrier go = new CyclicBarrier(CLOSERS);
        List<Future<Integer>> seen = new ArrayList<>();
        for (int i = 0; i < CLOSERS; i++) {
          seen.add(threads.submit(() -> {
            go.await(10, TimeUnit.SECONDS);
            client.close();
            return client.mappedSegments(); // what this caller sees as its close returns
          }));
        }
        for (Future<Integer> mapped : seen) {
          assertEquals(0, mapped.get(10, TimeUnit.SECONDS), "a close() returned before the client was closed");
        }
      }
    } finally {
      threads.shutdownNow();
    }
    assertEquals(0, daemon.server().registry().sessionCount(), "every session ended");
    assertEquals(0, daemon.server().pools().get(0).stats().get(PoolMetric.LEASED_BYTES));
  }

  @Test
  void closeTwice_isHarmless_andLeasesOfAClosedClientAreRefused() {
    GpuMemClient client = GpuMemClient.connect(daemon.unixTarget());
    client.close();
    client.close();
    GpuMemException e = org.junit.jupiter.api.Assertions.assertThrows(GpuMemException.class,
        () -> client.lease(0, 4096));
    assertTrue(e.getMessage() != null && !e.getMessage().isEmpty(), "the refusal says why");
  }
}
