package io.gpumemd.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.TestDaemon;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * A retention cap configured above a device's budget cannot be honoured (the budget bounds the
 * cache): the daemon starts with the budget as the cap and says so, once per device.
 */
class RetentionCapAtStartTest {
  @Test
  void capAboveTheBudget_isTheBudget_withAWarning() {
    try (LogCapture log = new LogCapture(GpumemdServer.class);
         TestDaemon daemon = TestDaemon.start("--retention-cap-bytes", "1TiB", "--device-limit-bytes", "128MiB")) {
      for (int device = 0; device < 2; device++) {
        assertEquals(128L << 20, daemon.server().pools().get(device).stats().get(PoolMetric.RETENTION_CAP_BYTES));
      }
      List<String> warnings = log.messages("WARN");
      assertEquals(2, warnings.size(), warnings.toString());
      assertTrue(warnings.get(0).equals("retention-cap-bytes: 1099511627776 is above the budget of device 0 "
          + "(134217728); using the budget"), warnings.get(0));
    }
  }
}
