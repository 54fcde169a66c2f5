package io.gpumemd.server.session;

import io.gpumemd.common.Sizes;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.LongAdder;
import org.slf4j.Logger;

/**
 * Session churn as operators see it: every open and end is a DEBUG line, and once a minute one
 * INFO line sums them up (opens, ends, ends that gave memory back, refusals by limit), only
 * when something happened. A flood of sessions thus writes one line a minute at INFO, not one
 * per session.
 *
 * <p>A session that ends holding memory is news (its leases came back without a Release), so
 * the first {@link #HOLDING_LINES_PER_WINDOW} of them in each window still get an INFO line of
 * their own; beyond that they go to DEBUG and the summary says how many were not told singly.
 *
 * <p>Thread-safety: the counters are adders read and reset by {@link #flush}, which runs on one
 * thread (the reaper); a count racing with a flush lands in this window or the next.
 */
final class SessionChurn {
  /** How often the summary line is written (when there is something to say). */
  static final long WINDOW_NANOS = TimeUnit.MINUTES.toNanos(1);
  /** Ends holding memory told singly at INFO per window; the rest are summed up. */
  static final int HOLDING_LINES_PER_WINDOW = 5;

  private final Logger log;
  private final LongAdder opened = new LongAdder();
  private final LongAdder ended = new LongAdder();
  private final LongAdder endedHolding = new LongAdder();
  private final LongAdder releasedLeases = new LongAdder();
  private final LongAdder releasedBytes = new LongAdder();
  private final LongAdder refusedTotal = new LongAdder();
  private final LongAdder refusedPerTenant = new LongAdder();
  private final LongAdder refusedRate = new LongAdder();
  private final AtomicInteger holdingToldSingly = new AtomicInteger();
  /** Written by the flushing thread only. */
  private long windowStartNanos;

  SessionChurn(Logger log, long nowNanos) {
    this.log = log;
    this.windowStartNanos = nowNanos;
  }

  /**
   * The current window's counts, in the order of {@link #restore}: window start (nanos),
   * opened, ended, ended holding, released leases, released bytes, refused total, refused per
   * tenant, refused by rate, ends told singly. For the snapshot; run on the flushing
   * thread's terms (no flush meanwhile).
   */
  long[] export() {
    return new long[] {windowStartNanos, opened.sum(), ended.sum(), endedHolding.sum(), releasedLeases.sum(),
        releasedBytes.sum(), refusedTotal.sum(), refusedPerTenant.sum(), refusedRate.sum(),
        holdingToldSingly.get()};
  }

  /** Continues a snapshot's window ({@link #export}'s layout), before any count here. */
  void restore(long[] state) {
    windowStartNanos = state[0];
    opened.add(state[1]);
    ended.add(state[2]);
    endedHolding.add(state[3]);
    releasedLeases.add(state[4]);
    releasedBytes.add(state[5]);
    refusedTotal.add(state[6]);
    refusedPerTenant.add(state[7]);
    refusedRate.add(state[8]);
    holdingToldSingly.set((int) state[9]);
  }

  void opened() {
    opened.increment();
  }

  /**
   * A session ended, giving back {@code leases} leases of {@code bytes} bytes.
   *
   * @return true when its end deserves an INFO line of its own (it held memory, and few such
   *     lines were written this window)
   */
  boolean ended(long leases, long bytes) {
    ended.increment();
    if (leases == 0) {
      return false;
    }
    endedHolding.increment();
    releasedLeases.add(leases);
    releasedBytes.add(bytes);
    return holdingToldSingly.incrementAndGet() <= HOLDING_LINES_PER_WINDOW;
  }

  void refusedTotal() {
    refusedTotal.increment();
  }

  void refusedPerTenant() {
    refusedPerTenant.increment();
  }

  void refusedRate() {
    refusedRate.increment();
  }

  /** Writes the summary when a window has passed and anything happened in it; resets it. */
  void flush(long nowNanos, int liveSessions) {
    long elapsed = nowNanos - windowStartNanos;
    if (elapsed < WINDOW_NANOS) {
      return;
    }
    windowStartNanos = nowNanos;
    long o = opened.sumThenReset();
    long e = ended.sumThenReset();
    long h = endedHolding.sumThenReset();
    long leases = releasedLeases.sumThenReset();
    long bytes = releasedBytes.sumThenReset();
    long rt = refusedTotal.sumThenReset();
    long rp = refusedPerTenant.sumThenReset();
    long rr = refusedRate.sumThenReset();
    int singly = Math.min(holdingToldSingly.getAndSet(0), HOLDING_LINES_PER_WINDOW);
    if (o == 0 && e == 0 && rt + rp + rr == 0) {
      return;
    }
    StringBuilder line = new StringBuilder("Sessions in the last ").append(TimeUnit.NANOSECONDS.toSeconds(elapsed))
        .append(" s: ").append(o).append(" opened, ").append(e).append(" ended");
    if (h > 0) {
      line.append(" (").append(h).append(" holding memory: ").append(leases).append(" leases, ")
          .append(Sizes.format(bytes)).append(" returned");
      if (h > singly) {
        line.append("; ").append(h - singly).append(" of them logged at DEBUG only");
      }
      line.append(')');
    }
    if (rt + rp + rr > 0) {
      line.append("; refused: ").append(rr).append(" by --session-open-rate, ").append(rp)
          .append(" by --max-sessions-per-tenant, ").append(rt).append(" by --max-sessions");
    }
    line.append("; ").append(liveSessions).append(" live");
    log.atInfo().addKeyValue("sessions_opened", o).addKeyValue("sessions_ended", e)
        .addKeyValue("sessions_ended_holding", h).addKeyValue("sessions_refused", rt + rp + rr)
        .addKeyValue("sessions_live", liveSessions).log(line.toString());
  }
}
