package io.gpumemd.server.auth;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Turns a kernel-vouched peer (uid, gid, pid) into a {@link Caller}: its tenant ({@code
 * --tenant-by uid|gid}) and whether it is an admin (root, the daemon's own uid, or a member of
 * {@code --admin-group}). Immutable and thread-safe; called once per accepted connection.
 *
 * @param tenantBy what names a tenant for a Unix-socket or loopback peer
 * @param daemonUid the daemon's own uid, an admin
 * @param adminGid the admin group's gid, or {@link Caller#UNKNOWN} for none
 */
public record IdentityPolicy(TenantBy tenantBy, int daemonUid, int adminGid) {
  private static final Logger log = LoggerFactory.getLogger(IdentityPolicy.class);

  /** What names a tenant for a Unix-socket or loopback peer. */
  public enum TenantBy { UID, GID }

  /** uid tenants, admins = root and the daemon's own uid. */
  public static IdentityPolicy defaults() {
    return new IdentityPolicy(TenantBy.UID, currentUid(), Caller.UNKNOWN);
  }

  /** A Unix-socket peer: SO_PEERCRED's uid, gid and pid. */
  public Caller unixPeer(int uid, int gid, int pid) {
    // The process's groups are read only when they can decide it: most peers are admins by uid
    // or there is no admin group, and every connection (a take-over's reattaching clients too)
    // would read /proc for nothing.
    boolean admin = isAdmin(uid, gid, Set.of())
        || (adminGid >= 0 && pid > 0 && isAdmin(uid, gid, supplementaryGroups(pid)));
    return new Caller(tenant(uid, gid), "uid " + uid + " gid " + gid + " pid " + pid, admin, uid, gid, pid, "pid " + pid);
  }

  /**
   * A loopback TCP peer whose socket the kernel says {@code uid} owns; no pid, and the gid is
   * the user's primary group from the password database.
   */
  public Caller loopbackPeer(int uid, String remote) {
    int gid = UnixAccounts.primaryGid(uid);
    boolean admin = isAdmin(uid, gid, UnixAccounts.groupsOf(uid));
    return new Caller(tenant(uid, gid), "uid " + uid + " tcp " + remote, admin, uid, gid, Caller.UNKNOWN, "tcp " + remote);
  }

  private String tenant(int uid, int gid) {
    return tenantBy == TenantBy.GID && gid >= 0 ? "gid:" + gid : "uid:" + uid;
  }

  private boolean isAdmin(int uid, int gid, Set<Integer> groups) {
    return uid == 0 || uid == daemonUid
        || (adminGid >= 0 && (gid == adminGid || groups.contains(adminGid)));
  }

  /** A process's supplementary groups from {@code /proc/PID/status}; empty if it is gone. */
  static Set<Integer> supplementaryGroups(int pid) {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/" + pid + "/status"))) {
        if (line.startsWith("Groups:")) {
          Set<Integer> groups = new HashSet<>();
          for (String g : line.substring("Groups:".length()).trim().split("\\s+")) {
            if (!g.isEmpty()) {
              groups.add(Integer.parseInt(g));
            }
          }
          return groups;
        }
      }
    } catch (IOException | NumberFormatException e) {
      log.debug("Cannot read the groups of pid {}: {}", pid, e.toString());
    }
    return Set.of();
  }

  /** This process's uid (the owner of {@code /proc/self}). */
  public static int currentUid() {
    try {
      return (Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid");
    } catch (IOException | UnsupportedOperationException e) {
      return Caller.UNKNOWN;
    }
  }

  @Override
  public String toString() {
    return "tenants by " + tenantBy.name().toLowerCase(java.util.Locale.ROOT) + ", admins: root"
        + (daemonUid > 0 ? ", uid " + daemonUid + " (the daemon's)" : "")
        + (adminGid >= 0 ? ", members of gid " + adminGid : "");
  }

  static List<String> lines(Path file) {
    try {
      return Files.readAllLines(file);
    } catch (IOException e) {
      return List.of();
    }
  }
}
