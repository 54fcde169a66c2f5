package io.gpumemd.server.testing;

import io.gpumemd.common.Ticker;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/** A {@link Ticker} that moves only when a test advances it. Thread-safe. */
public final class FakeTicker implements Ticker {
  private final AtomicLong nanos = new AtomicLong(1_000_000_000L);

  @Override
  public long nanos() {
    return nanos.get();
  }

  public void advance(long amount, TimeUnit unit) {
    nanos.addAndGet(unit.toNanos(amount));
  }
}
