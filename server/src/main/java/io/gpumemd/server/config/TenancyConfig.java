package io.gpumemd.server.config;

import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.session.Quota;

/**
 * Who the daemon's callers are and what keeps them apart; part of {@link ServerConfig}.
 *
 * @param tenantBy what makes a local peer's tenant
 * @param adminGroup the admin group as configured (name or number), empty for none
 * @param adminGid its gid, or -1 for none
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
    int adminGid,
    boolean isolateSessions,
    Quota tenantQuota,
    String socketMode,
    String socketGroup) {

  /** The identity policy of this daemon, running as {@code daemonUid}. */
  public IdentityPolicy identityPolicy(int daemonUid) {
    return new IdentityPolicy(tenantBy, daemonUid, adminGid);
  }
}
