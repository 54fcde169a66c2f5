package io.gpumemd.server.config;

import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.auth.UnixAccounts;
import io.gpumemd.server.books.Quota;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Who the daemon's callers are and what keeps them apart; part of {@link ServerConfig}.
 *
 * @param tenantBy what makes a local peer's tenant
 * @param adminGroup the admin group as configured (name or number), empty for none; resolved
 *     to its gid when the daemon starts (checked by {@link HostChecks})
 * @param isolateSessions every session gets segments of its own
 * @param tenantQuota limits over all sessions of one tenant (0 = unlimited)
 * @param socketMode permissions of the Unix socket as {@code rwxrwxrwx} text: who may connect
 *     at all (who they are is decided per connection, by the kernel)
 * @param socketGroup the socket's group (a name or gid, resolved when the socket is made, as the
 *     group may exist only where the daemon runs), or empty to leave the daemon's
 */
public record TenancyConfig(
    IdentityPolicy.TenantBy tenantBy,
    String adminGroup,
    boolean isolateSessions,
    Quota tenantQuota,
    String socketMode,
    String socketGroup) {

  /** Reads and checks the tenancy options; a problem is recorded in {@code s}. */
  static TenancyConfig from(Settings s) {
    return new TenancyConfig(
        IdentityPolicy.TenantBy.valueOf(s.choice("tenant-by", List.of("uid", "gid")).toUpperCase(Locale.ROOT)),
        s.text("admin-group"),
        s.choice("isolate", List.of("tenant", "session")).equals("session"),
        new Quota(s.size("tenant-max-leased-bytes"), s.integer("tenant-max-leases", 0, Long.MAX_VALUE)),
        socketMode(s),
        s.text("socket-group").isEmpty() ? s.text("shm-group") : s.text("socket-group"));
  }

  /** The socket's mode as rwx text: 0600, or 0660 with a shm group, unless given. */
  private static String socketMode(Settings s) {
    String mode = s.text("socket-mode");
    if (mode.isEmpty()) {
      return s.text("shm-group").isEmpty() ? "rw-------" : "rw-rw----";
    }
    if (!mode.matches("0?[0-7]{3}")) {
      s.problem(s.get("socket-mode"), "an octal mode such as 0600, 0660 or 0666");
      return "rw-------";
    }
    int bits = Integer.parseInt(mode, 8);
    StringBuilder rwx = new StringBuilder();
    for (int shift = 6; shift >= 0; shift -= 3) {
      int b = (bits >> shift) & 7;
      rwx.append((b & 4) != 0 ? 'r' : '-').append((b & 2) != 0 ? 'w' : '-').append((b & 1) != 0 ? 'x' : '-');
    }
    return rwx.toString();
  }

  /** The admin group's gid, looked up now; -1 for none, or for a group this host does not know. */
  public int adminGid() {
    return adminGroup.isEmpty() ? -1 : UnixAccounts.gidOf(adminGroup);
  }

  /** The identity policy of this daemon, running as {@code daemonUid}; looks up the admin group. */
  public IdentityPolicy identityPolicy(int daemonUid) {
    return new IdentityPolicy(tenantBy, daemonUid, adminGid());
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("tenant-by", tenantBy.name().toLowerCase(Locale.ROOT));
    values.put("admin-group", adminGroup.isEmpty() ? "(none)" : adminGroup);
    values.put("socket-mode", socketMode);
    values.put("socket-group", socketGroup.isEmpty() ? "(the daemon's)" : socketGroup);
    values.put("isolate", isolateSessions ? "session" : "tenant");
    values.put("tenant-max-leased-bytes", tenantQuota.maxLeasedBytes());
    values.put("tenant-max-leases", tenantQuota.maxLeases());
  }
}
