package io.gpumemd.server.auth;

/**
 * Who is calling, as the daemon decided it: the tenant the call acts for, whether it may use
 * the admin verbs, and where it comes from. Built once per connection for kernel-vouched peers
 * (a Unix socket's SO_PEERCRED, a loopback TCP socket's owner) and per call for bearer tokens;
 * immutable.
 *
 * @param tenant the key that owns sessions, leases and segments ({@code uid:1000}, {@code
 *     gid:100}, {@code token:team-a}, {@code cert:CN=worker}, {@code anonymous})
 * @param principal who it is, for logs and ListSessions ({@code uid 1000 pid 4242}, {@code token
 *     'ci-bot'})
 * @param admin may run Trim, SetRetentionCap, end other tenants' sessions and list everything
 * @param uid the peer's uid, or {@link #UNKNOWN} (token and certificate callers, remote peers)
 * @param gid the peer's primary gid, or {@link #UNKNOWN}
 * @param pid the peer's pid, or {@link #UNKNOWN} (only a Unix socket tells it)
 * @param origin the process or connection a KeepAlive stream is pinned to ({@code pid 4242},
 *     {@code tcp 127.0.0.1:40312})
 */
public record Caller(String tenant, String principal, boolean admin, int uid, int gid, int pid, String origin) {
  public static final int UNKNOWN = -1;

  /**
   * The daemon itself: embedded callers and tests that talk to the registry directly, never a
   * network peer. It acts for every tenant.
   */
  public static final Caller DAEMON = new Caller("daemon", "the daemon", true, UNKNOWN, UNKNOWN, UNKNOWN, "daemon");

  /**
   * A peer nothing vouches for (a remote TCP client without a token or certificate, accepted
   * only under {@code --insecure-tcp}): all of them share one tenant, and none is admin.
   */
  public static Caller anonymous(String origin) {
    return new Caller("anonymous", "anonymous " + origin, false, UNKNOWN, UNKNOWN, UNKNOWN, origin);
  }

  /** True when this caller acts for {@code otherTenant}; the daemon itself acts for all of them. */
  public boolean owns(String otherTenant) {
    return this == DAEMON || tenant.equals(otherTenant);
  }

  @Override
  public String toString() {
    return principal + (admin ? " (admin)" : "");
  }
}
