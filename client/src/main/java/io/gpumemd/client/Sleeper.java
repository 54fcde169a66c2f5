package io.gpumemd.client;

import java.util.concurrent.TimeUnit;

/**
 * Waits for a while: the real {@link #system()} one, or a test's that moves its {@code Ticker}
 * instead, so that backoff is tested without sleeping (as Guava's {@code SleepingStopwatch}).
 */
@FunctionalInterface
interface Sleeper {
  void sleep(long nanos) throws InterruptedException;

  static Sleeper system() {
    return TimeUnit.NANOSECONDS::sleep;
  }
}
