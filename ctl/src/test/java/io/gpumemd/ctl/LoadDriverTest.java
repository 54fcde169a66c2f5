package io.gpumemd.ctl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The load driver's measured window, without a daemon. */
class LoadDriverTest {
  @Test
  void threaded_aFirstOpLongerThanWarmupAndWindow_stillMeasuresTheOpsAfterIt() {
    // A fresh JVM's first lease (connection, class loading, compiling) can outlast a short
    // warm-up and the whole window on a loaded machine: the window opens after it, not during it.
    AtomicInteger calls = new AtomicInteger();
    LoadDriver.Op op = () -> {
      if (calls.getAndIncrement() == 0) {
        Thread.sleep(300);
      }
      return true;
    };
    LoadResult r = LoadDriver.threaded("test", "cold first op", 1, LoadDriver.Timing.ofSeconds(0, 0.05), true,
        Map.of(), op, () -> { });
    assertEquals(0, r.errors, String.valueOf(r.firstError));
    assertTrue(r.ops > 0, "ops measured after the cold first op: " + r.ops);
  }
}
