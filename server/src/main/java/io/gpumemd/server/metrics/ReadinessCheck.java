package io.gpumemd.server.metrics;

/**
 * What {@code GET /readyz} asks: whether the daemon can take work now. {@link MetricsHttpServer}
 * answers 200 when {@link #problem} is null and 503 with its text otherwise.
 *
 * <p>Called on the metrics event-loop thread for every probe (a kubelet asks every few seconds):
 * an implementation must be cheap, must not block, and must be safe to call from that thread.
 */
@FunctionalInterface
public interface ReadinessCheck {
  /** Always ready: for a metrics listener that has no daemon behind it (tests). */
  ReadinessCheck ALWAYS = () -> null;

  /** Null when ready; otherwise one line, for a person, saying why not. */
  String problem();
}
