package io.gpumemd.client;

import java.util.List;

/**
 * What the application does when an admin puts its session to sleep and wakes it ({@code
 * gpumemctl sleep SESSION}, {@code gpumemctl wake SESSION}; README "Sleep and wake"): touching a
 * sleeping lease's memory faults, so only the application can make an admin's sleep safe, by
 * pausing its work first. Registered with {@link GpuMemClient#onSleepAsked}; the daemon refuses
 * an admin's sleep of a session whose client registered none.
 *
 * <p>The calls come on a thread of the client's own, one at a time, never on the gRPC thread: a
 * handler may block until its work is paused. Between {@link #pause} and {@link #resume} the
 * session's leases sleep (or are being put to sleep, or woken).
 */
public interface SleepHandler {
  /**
   * An admin asks to sleep the session: return once no work of this process touches the
   * session's memory (the client then gives back its cached leases, vacates its mappings and
   * sleeps). Throw to refuse: the admin gets FAILED_PRECONDITION with the exception's message,
   * and nothing sleeps ({@link #resume} is not called).
   *
   * @param level 1 (contents kept in the daemon's host memory) or 2 (dropped: the wake gives zeros)
   * @param tags the tags whose segments sleep; empty: every lease
   */
  void pause(int level, List<String> tags) throws Exception;

  /**
   * The work may go on: after the admin's wake (every lease is mapped again at its address), or
   * after a sleep the daemon refused (nothing slept). Not called after a wake that failed: the
   * session still sleeps.
   */
  void resume();
}
