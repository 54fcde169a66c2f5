package io.gpumemd.server.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.LogCapture;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import io.prometheus.metrics.model.registry.Collector;
import io.prometheus.metrics.model.snapshots.MetricSnapshot;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;

/**
 * A meter that fails (throws, or a counter that reads negative) is left out of the scrape; the
 * other meters, other tags of the same registry included, still answer, and each failing meter
 * is logged at WARN once however many scrapes fail.
 */
class IsolatingPrometheusRegistryTest {
  private final PrometheusMeterRegistry registry = IsolatingPrometheusRegistry.newMeterRegistry();

  /** Good meters, and two broken ones: one whose function throws, one that counts -2. */
  private void registerMeters(MeterRegistry r) {
    r.counter("gpumemd.good", "device", "0").increment();
    r.counter("gpumemd.good", "device", "1").increment(2);
    Gauge.builder("gpumemd.level", () -> 3).register(r);
    FunctionCounter.builder("gpumemd.throws", this, x -> {
      throw new IllegalStateException("broken meter");
    }).register(r);
    FunctionCounter.builder("gpumemd.negative", this, x -> -2).tag("device", "0").register(r);
  }

  @Test
  void micrometersOwnRegistry_failsTheWholeScrape() {
    // The premise (Micrometer 1.16, prometheus-metrics 1.4): one meter's failure is the scrape's.
    PrometheusMeterRegistry plain = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
    registerMeters(plain);
    assertThrows(RuntimeException.class, plain::scrape);
  }

  @Test
  void failingMeters_areLeftOut_theOthersAnswer_andEachIsWarnedOnce() {
    registerMeters(registry);
    try (LogCapture log = new LogCapture(IsolatingPrometheusRegistry.class)) {
      for (int i = 0; i < 3; i++) {
        String text = registry.scrape();
        assertTrue(text.contains("gpumemd_good_total{device=\"0\"} 1.0"), text);
        assertTrue(text.contains("gpumemd_good_total{device=\"1\"} 2.0"), text);
        assertTrue(text.contains("gpumemd_level 3.0"), text);
        assertFalse(text.contains("gpumemd_throws"), text);
        assertFalse(text.contains("gpumemd_negative"), text);
      }
      List<String> warnings = log.messages("WARN");
      assertEquals(2, warnings.size(), "once per failing meter, not per scrape: " + warnings);
      assertTrue(warnings.stream().anyMatch(w -> w.startsWith("Metrics: meter gpumemd.throws failed")), warnings.toString());
      assertTrue(warnings.stream().anyMatch(w -> w.startsWith("Metrics: meter gpumemd.negative failed")), warnings.toString());
    }
  }

  @Test
  void aMeterThatRecovers_isBackInTheScrape() {
    AtomicBoolean broken = new AtomicBoolean(true);
    FunctionCounter.builder("gpumemd.flaky", broken, b -> {
      if (b.get()) {
        throw new IllegalStateException("not yet");
      }
      return 5;
    }).register(registry);
    assertFalse(registry.scrape().contains("gpumemd_flaky"));
    broken.set(false);
    assertTrue(registry.scrape().contains("gpumemd_flaky_total 5.0"), registry.scrape());
  }

  @Test
  void aRemovedMeter_leavesTheScrape() {
    FunctionCounter counter = FunctionCounter.builder("gpumemd.gone", this, x -> 1).register(registry);
    registry.counter("gpumemd.stays").increment();
    assertTrue(registry.scrape().contains("gpumemd_gone_total 1.0"));
    registry.remove(counter);
    String text = registry.scrape();
    assertFalse(text.contains("gpumemd_gone"), text);
    assertTrue(text.contains("gpumemd_stays_total 1.0"), text);
  }

  @Test
  void aCollectorRegisteredDirectly_isIsolatedToo_andNamedByItself() {
    registry.counter("gpumemd.stays").increment();
    registry.getPrometheusRegistry().register(new Collector() {
      @Override
      public MetricSnapshot collect() {
        throw new IllegalStateException("direct collector");
      }

      @Override
      public String getPrometheusName() {
        return "direct_metric";
      }
    });
    try (LogCapture log = new LogCapture(IsolatingPrometheusRegistry.class)) {
      assertTrue(registry.scrape().contains("gpumemd_stays_total 1.0"));
      assertEquals(1, log.messages("WARN").size());
      assertTrue(log.messages("WARN").get(0).startsWith("Metrics: meter direct_metric failed"), log.messages("WARN").toString());
    }
  }
}
