package io.gpumemd.server.session;

import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.pool.Block;
import io.gpumemd.server.pool.DevicePools;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * The shared blocks of one Sleep (issue 35 item 4): a lease whose block other sessions hold
 * (Attach of a share token, Lookup of a published name) sleeps only once they have released
 * those holds, and its share tokens and names stay, refusing to attach or look up until the wake.
 *
 * <p>The steps, in order: {@link #closeAndAwait} closes each such block to new holds (an Attach
 * or Lookup racing the sleep is refused, naming it, so the wait cannot be prolonged by newcomers)
 * and waits, bounded by {@code --unmap-wait-ms}, for the other holds to go; a hold left at the
 * deadline refuses the sleep, naming its session and the wait it was given, and reopens every
 * block (nothing changed). Then {@link #fellAsleep} counts each block out of the pool's shared
 * and published figures before the pool frees it, and {@link #freed} records where it was. A
 * refusal later in the sleep (the host store's bound) reopens them too ({@link #reopen}). The
 * wake is {@link SharedBlock#wake}.
 *
 * <p>The wait holds no lock: each block's wait gives up its monitor, which the releases it waits
 * for take, and another session's calls take nothing this one holds. Only this session's
 * Lease, Share and Publish are refused meanwhile, as for any Sleep under way; a Release of the
 * sleeping lease itself is ordered by its record ({@link LeaseRecord#fallAsleep}), and its block
 * then reopens. Waiting is on each block's monitor, notified by each release of a hold, so the
 * wait ends as soon as the last hold goes.
 *
 * <p>Not thread-safe: one instance per Sleep call, used by its thread only.
 */
final class SharedSleep {
  /** The sleepers whose blocks this sleep closed, in order. */
  private final List<LeaseRecord> closed = new ArrayList<>();
  /** How long the holders were waited for, for the sleep's log line. */
  private long waitedNanos;

  private SharedSleep() {}

  /**
   * Closes the shared blocks of {@code sleepers} to new holds and waits for their other holders.
   *
   * @throws ConflictException naming the holders left at the deadline; every block reopened
   */
  static SharedSleep closeAndAwait(Session session, List<LeaseRecord> sleepers, DevicePools pools) {
    SharedSleep sleep = new SharedSleep();
    long waitNanos = 0;
    for (LeaseRecord r : sleepers) {
      SharedBlock shared = r.shared();
      if (shared != null && !shared.returned()) {
        shared.closeForSleep(session.toString());
        sleep.closed.add(r);
        waitNanos = Math.max(waitNanos, pools.get(r.block().device()).sleep().unmapWaitNanos());
      }
    }
    if (sleep.closed.isEmpty()) {
      return sleep;
    }
    long start = System.nanoTime();
    long deadline = start + waitNanos;
    List<String> refusals = new ArrayList<>();
    try {
      for (LeaseRecord r : sleep.closed) {
        List<String> left = r.shared().awaitAlone(r, deadline);
        if (!left.isEmpty()) {
          refusals.add(describe(r) + " is still held by " + String.join(", ", left));
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      sleep.reopen();
      throw new ConflictException(session + ": its sleep was interrupted while it waited for the holders of its "
          + "shared blocks; nothing changed");
    }
    sleep.waitedNanos = System.nanoTime() - start;
    if (!refusals.isEmpty()) {
      sleep.reopen();
      throw new ConflictException(String.join("; ", refusals) + " after " + TimeUnit.NANOSECONDS.toMillis(waitNanos)
          + " ms of waiting for its holders to release it (--unmap-wait-ms): a block others map cannot be freed; "
          + "nothing changed: release those holds first, or sleep with tags that leave its segment awake");
    }
    return sleep;
  }

  /** For the sleep's log line: "" when no block was shared, else what the wait took. */
  String waited() {
    return closed.isEmpty() ? "" : ", " + closed.size() + " shared blocks (holders waited for "
        + TimeUnit.NANOSECONDS.toMillis(waitedNanos) + " ms)";
  }

  private static String describe(LeaseRecord r) {
    String name = r.shared().name();
    return "lease " + r.id() + " of " + r.session() + (name.isEmpty() ? " (shared)" : " (published as '" + name + "')");
  }

  /**
   * The sleeper went to sleep (its record says so): its block, if this sleep closed it, counts
   * out of the pool's shared and published figures before the pool frees it.
   */
  void fellAsleep(LeaseRecord sleeper, DevicePools pools) {
    if (closed.contains(sleeper)) {
      sleeper.shared().fallAsleep(pools.get(sleeper.block().device()));
    }
  }

  /** The pool freed the sleeper's block; {@code place} is where it was. */
  void freed(LeaseRecord sleeper, Block place) {
    if (closed.contains(sleeper)) {
      sleeper.shared().freed(place);
    }
  }

  /** The sleeper did not go to sleep (released meanwhile): its block, if closed, takes holds again. */
  void notAsleep(LeaseRecord sleeper) {
    if (closed.contains(sleeper)) {
      sleeper.shared().reopen();
    }
  }

  /** The sleep was refused: every block it closed and did not put to sleep takes holds again. */
  void reopen() {
    closed.forEach(r -> r.shared().reopen());
  }
}
