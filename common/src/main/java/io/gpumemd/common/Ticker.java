package io.gpumemd.common;

/**
 * Source of monotonic time in nanoseconds (after Caffeine's {@code Ticker}), injected so that
 * TTL, grace periods and leak thresholds are tested without sleeping.
 */
@FunctionalInterface
public interface Ticker {
  long nanos();

  static Ticker system() {
    return System::nanoTime;
  }
}
