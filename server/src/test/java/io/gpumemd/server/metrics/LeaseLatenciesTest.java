package io.gpumemd.server.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.micrometer.core.instrument.Timer;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Lease latencies reach their timers at a drain, each under its device and result with its own
 * nanoseconds, and none is lost when leases fill the ring faster than drains empty it.
 */
class LeaseLatenciesTest {
  private final SimpleMeterRegistry registry = new SimpleMeterRegistry();

  private Timer[][] timers(int devices) {
    Timer[][] timers = new Timer[devices][2];
    for (int d = 0; d < devices; d++) {
      for (int hit = 0; hit < 2; hit++) {
        timers[d][hit] = Timer.builder("lease").tag("device", "" + d).tag("hit", "" + hit).register(registry);
      }
    }
    return timers;
  }

  @Test
  void figures_reachTheirTimers_atTheDrain_withTheirDeviceResultAndTime() {
    Timer[][] timers = timers(3);
    LeaseLatencies latencies = new LeaseLatencies(timers);
    latencies.record(0, true, 1_000);
    latencies.record(2, false, 5_000_000_000L);
    latencies.record(2, false, 7);
    latencies.record(1, true, 0);

    assertEquals(0, timers[2][0].count(), "nothing recorded on the lease's own thread");
    assertEquals(4, latencies.drain());

    assertEquals(1, timers[0][1].count());
    assertEquals(1_000, timers[0][1].totalTime(TimeUnit.NANOSECONDS));
    assertEquals(2, timers[2][0].count());
    assertEquals(5_000_000_007L, timers[2][0].totalTime(TimeUnit.NANOSECONDS));
    assertEquals(1, timers[1][1].count());
    assertEquals(0, timers[0][0].count() + timers[1][0].count() + timers[2][1].count(), "nothing elsewhere");
    assertEquals(0, latencies.drain(), "a drain takes each figure once");
  }

  @Test
  void leasesFromManyThreads_pastTheRingsCapacity_loseNoFigure() throws Exception {
    Timer[][] timers = timers(2);
    LeaseLatencies latencies = new LeaseLatencies(timers);
    int threads = 4;
    int each = 3 * LeaseLatencies.CAPACITY;
    List<Thread> leasing = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      int device = t % 2;
      Thread thread = new Thread(() -> {
        for (int i = 0; i < each; i++) {
          latencies.record(device, i % 2 == 0, 100 + i);
        }
      });
      leasing.add(thread);
      thread.start();
    }
    // A drain running beside the leases, as housekeeping's does.
    Thread housekeeping = new Thread(() -> {
      while (leasing.stream().anyMatch(Thread::isAlive)) {
        latencies.drain();
      }
    });
    housekeeping.start();
    for (Thread t : leasing) {
      t.join(30_000);
    }
    housekeeping.join(30_000);
    latencies.drain();

    long perThreadTotal = (long) each * 100 + (long) each * (each - 1) / 2;
    long count = 0;
    long total = 0;
    for (Timer[] device : timers) {
      for (Timer timer : device) {
        count += timer.count();
        total += (long) timer.totalTime(TimeUnit.NANOSECONDS);
      }
    }
    assertEquals((long) threads * each, count, "every lease's figure recorded once");
    assertEquals(threads * perThreadTotal, total, "with its own time");
    assertEquals((long) threads * each / 2, timers[0][1].count() + timers[1][1].count(), "half of them hits");
  }
}
