package io.gpumemd.server.metrics;

import io.micrometer.core.instrument.Clock;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import io.prometheus.metrics.model.registry.Collector;
import io.prometheus.metrics.model.registry.MultiCollector;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import io.prometheus.metrics.model.registry.PrometheusScrapeRequest;
import io.prometheus.metrics.model.snapshots.MetricSnapshot;
import io.prometheus.metrics.model.snapshots.MetricSnapshots;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Predicate;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Prometheus registry under the daemon's {@link PrometheusMeterRegistry}, changed in one
 * way: a meter family (one meter name, all its tags) whose collection fails is left out of the
 * scrape instead of failing the scrape. Micrometer 1.16 on prometheus-metrics 1.4 lets any
 * exception of one collector out of {@code scrape()}: a function counter whose function throws,
 * or one that reads negative, which {@code CounterSnapshot} refuses ({@code "-2.0: counters
 * cannot have a negative value"}). One such meter emptied every {@code /metrics} reply (issue
 * 22). Each failing family is logged at WARN once, with its meter name and the cause; later
 * failures of it at DEBUG. It is back in the scrape as soon as it collects again.
 *
 * <p>Every collector registered is wrapped; Micrometer registers one per meter name (a {@link
 * MultiCollector}) while it creates that name's first meter, and then announces the meter on
 * the same thread, which is how a wrapper learns the meter name its WARN line gives.
 *
 * <p>Thread-safety: registration and scrapes may run on any threads; the wrappers are found by
 * identity in a concurrent map, and each one's warned flag is atomic.
 */
public final class IsolatingPrometheusRegistry extends PrometheusRegistry {
  private static final Logger log = LoggerFactory.getLogger(IsolatingPrometheusRegistry.class);

  private final Map<Object, Family> families = new ConcurrentHashMap<>();
  /** The family registered on this thread whose meter Micrometer has not announced yet. */
  private final ThreadLocal<Family> unnamed = new ThreadLocal<>();

  private IsolatingPrometheusRegistry() {}

  /** A Micrometer registry for Prometheus whose scrapes survive a failing meter. */
  public static PrometheusMeterRegistry newMeterRegistry() {
    IsolatingPrometheusRegistry collectors = new IsolatingPrometheusRegistry();
    PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT, collectors, Clock.SYSTEM);
    registry.config().onMeterAdded(meter -> {
      Family family = collectors.unnamed.get();
      if (family != null) {
        collectors.unnamed.remove();
        family.name = meter.getId().getName();
      }
    });
    return registry;
  }

  @Override
  public void register(MultiCollector collector) {
    Family family = new Family();
    super.register(new IsolatedMulti(collector, family));
    families.put(collector, family);
    if (collector.getPrometheusNames().isEmpty()) { // Micrometer's: named when its meter is announced
      unnamed.set(family);
    } else {
      family.name = String.join(", ", collector.getPrometheusNames());
    }
  }

  @Override
  public void register(Collector collector) {
    Family family = new Family();
    super.register(new IsolatedSingle(collector, family));
    families.put(collector, family);
    family.name = collector.getPrometheusName();
  }

  @Override
  public void unregister(MultiCollector collector) {
    Family family = families.remove(collector);
    super.unregister(family == null ? collector : (MultiCollector) family.wrapper);
  }

  @Override
  public void unregister(Collector collector) {
    Family family = families.remove(collector);
    super.unregister(family == null ? collector : (Collector) family.wrapper);
  }

  @Override
  public void clear() {
    super.clear();
    families.clear();
  }

  /** What the wrappers of one registered collector share: its name once known, whether it was warned. */
  private static final class Family {
    volatile String name;
    Object wrapper;
    private final AtomicBoolean warned = new AtomicBoolean();

    <T> T collect(Supplier<T> collect, T instead) {
      try {
        return collect.get();
      } catch (RuntimeException e) {
        String meter = name == null ? "a meter" : "meter " + name;
        if (warned.compareAndSet(false, true)) {
          log.warn("Metrics: {} failed and is left out of /metrics while it fails; the other meters still answer",
              meter, e);
        } else {
          log.debug("Metrics: {} failed again: {}", meter, e.toString());
        }
        return instead;
      }
    }
  }

  private static final class IsolatedMulti implements MultiCollector {
    private static final MetricSnapshots NONE = new MetricSnapshots();
    private final MultiCollector delegate;
    private final Family family;

    IsolatedMulti(MultiCollector delegate, Family family) {
      this.delegate = delegate;
      this.family = family;
      family.wrapper = this;
    }

    @Override
    public MetricSnapshots collect() {
      return family.collect(delegate::collect, NONE);
    }

    @Override
    public MetricSnapshots collect(PrometheusScrapeRequest request) {
      return family.collect(() -> delegate.collect(request), NONE);
    }

    @Override
    public MetricSnapshots collect(Predicate<String> includedNames) {
      return family.collect(() -> delegate.collect(includedNames), NONE);
    }

    @Override
    public MetricSnapshots collect(Predicate<String> includedNames, PrometheusScrapeRequest request) {
      return family.collect(() -> delegate.collect(includedNames, request), NONE);
    }

    @Override
    public List<String> getPrometheusNames() {
      return delegate.getPrometheusNames();
    }
  }

  /** A single collector: none of Micrometer's, but one registered here directly is isolated too. */
  private static final class IsolatedSingle implements Collector {
    private final Collector delegate;
    private final Family family;

    IsolatedSingle(Collector delegate, Family family) {
      this.delegate = delegate;
      this.family = family;
      family.wrapper = this;
    }

    @Override
    public MetricSnapshot collect() {
      return family.collect(delegate::collect, null); // the registry skips a null snapshot
    }

    @Override
    public MetricSnapshot collect(PrometheusScrapeRequest request) {
      return family.collect(() -> delegate.collect(request), null);
    }

    @Override
    public MetricSnapshot collect(Predicate<String> includedNames) {
      return family.collect(() -> delegate.collect(includedNames), null);
    }

    @Override
    public MetricSnapshot collect(Predicate<String> includedNames, PrometheusScrapeRequest request) {
      return family.collect(() -> delegate.collect(includedNames, request), null);
    }

    @Override
    public String getPrometheusName() {
      return delegate.getPrometheusName();
    }
  }
}
