package io.gpumemd.server.fd;

import io.gpumemd.common.Ticker;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;

/**
 * Refusals of one kind on the fd channel (or connections it closed for one kind of reason),
 * logged as one WARN line a minute at most: how many there were since the last line, and the
 * latest one in full. A peer that floods the channel with bad requests costs the log a line a
 * minute; each refusal is also logged at DEBUG.
 *
 * <p>Thread-safe: counters are atomic; two threads racing for the same minute log once.
 */
final class RefusalLog {
  private static final long EVERY_NANOS = TimeUnit.MINUTES.toNanos(1);

  private final Logger log;
  private final String verb;
  private final String what;
  private final Ticker ticker;
  private final AtomicLong sinceLine = new AtomicLong();
  private final AtomicLong lastLineNanos;

  /** @param what the refused thing ("request", "connection") */
  RefusalLog(Logger log, String what, Ticker ticker) {
    this(log, "refused", what, ticker);
  }

  /**
   * @param verb what befell it ("refused", "closed")
   * @param what the thing ("request", "connection")
   */
  RefusalLog(Logger log, String verb, String what, Ticker ticker) {
    this.log = log;
    this.verb = verb;
    this.what = what;
    this.ticker = ticker;
    this.lastLineNanos = new AtomicLong(ticker.nanos() - EVERY_NANOS);
  }

  /** Counts one; {@code detail} says whose and why. */
  void refused(String detail) {
    sinceLine.incrementAndGet();
    log.debug("fd channel {}: {}", verb, detail);
    long now = ticker.nanos();
    long last = lastLineNanos.get();
    if (now - last >= EVERY_NANOS && lastLineNanos.compareAndSet(last, now)) {
      long count = sinceLine.getAndSet(0);
      log.atWarn().addKeyValue(verb + "_" + what + "s", count)
          .log("fd channel: {} {} {}(s) since the last such line; the latest: {}", verb, count, what, detail);
    }
  }
}
