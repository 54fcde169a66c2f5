package io.gpumemd.server.testing;

import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * Bounded polling for state a test's daemon or client reaches asynchronously (notices are
 * batched, releases wait for events): never an unbounded loop, and a failure that names what
 * was awaited. Stateless.
 */
public final class Await {
  private static final long LIMIT_SECONDS = 10;

  private Await() {}

  /** Polls {@code condition} every 2 ms until it holds; fails after 10 s naming {@code what}. */
  public static void until(BooleanSupplier condition, String what) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(LIMIT_SECONDS);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("not within " + LIMIT_SECONDS + " s: " + what);
      }
      try {
        Thread.sleep(2);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AssertionError(e);
      }
    }
  }
}
