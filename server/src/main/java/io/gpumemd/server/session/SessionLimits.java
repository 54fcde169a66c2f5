package io.gpumemd.server.session;

/**
 * Bounds on sessions, so that one peer cannot grow the daemon without limit by opening
 * sessions (each costs memory, a map entry and a log line): live sessions in all and per
 * tenant, and how fast one tenant may open them. 0 means no limit, for each.
 *
 * <p>Who is bound: every network caller, admins included, by all three. Admins are not exempt
 * from the total because the total is what protects the daemon's memory, and nothing an
 * operator needs at the limit takes a session: ListSessions, CloseSession of any session,
 * Trim, SetRetentionCap and health checks work without one. The daemon's own in-process caller
 * ({@link io.gpumemd.server.auth.Caller#DAEMON}) is no peer and is bound by the total only.
 *
 * @param maxSessions live sessions in all ({@code --max-sessions})
 * @param maxSessionsPerTenant live sessions of one tenant ({@code --max-sessions-per-tenant})
 * @param openRatePerSecond session opens per second per tenant, a token bucket whose burst is
 *     the same number ({@code --session-open-rate})
 */
public record SessionLimits(int maxSessions, int maxSessionsPerTenant, int openRatePerSecond) {
  public static final int DEFAULT_MAX_SESSIONS = 10_000;
  public static final int DEFAULT_MAX_SESSIONS_PER_TENANT = 1_000;
  public static final int DEFAULT_OPEN_RATE = 100;

  /** The daemon's defaults. */
  public static final SessionLimits DEFAULTS =
      new SessionLimits(DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SESSIONS_PER_TENANT, DEFAULT_OPEN_RATE);

  /** No bounds at all (tests of other things). */
  public static final SessionLimits UNLIMITED = new SessionLimits(0, 0, 0);

  public SessionLimits {
    if (maxSessions < 0 || maxSessionsPerTenant < 0 || openRatePerSecond < 0) {
      throw new IllegalArgumentException("session limits: negative (expected: 0 = none, or a positive bound)");
    }
  }
}
