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
 * @param socketGid the socket's group, or -1 to leave the daemon's
 */
public record TenancyConfig(
    IdentityPolicy.TenantBy tenantBy,
    String adminGroup,
    int adminGid,
    boolean isolateSessions,
    Quota tenantQuota,
    String socketMode,
    int socketGid) {

  /** The identity policy of this daemon, running as {@code daemonUid}. */
  public IdentityPolicy identityPolicy(int daemonUid) {
    return new IdentityPolicy(tenantBy, daemonUid, adminGid);
  }
}
