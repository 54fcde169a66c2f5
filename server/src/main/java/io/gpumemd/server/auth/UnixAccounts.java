package io.gpumemd.server.auth;

import java.nio.file.Path;
import java.util.HashSet;
import java.util.Set;

/**
 * Reads the password and group databases ({@code /etc/passwd}, {@code /etc/group}) for peers
 * whose pid is unknown (loopback TCP), and resolves {@code --admin-group} names. Stateless.
 */
public final class UnixAccounts {
  private UnixAccounts() {}

  /** The primary gid of a uid, or {@link Caller#UNKNOWN} when the uid has no passwd entry. */
  static int primaryGid(int uid) {
    for (String line : IdentityPolicy.lines(Path.of("/etc/passwd"))) {
      String[] f = line.split(":", -1);
      if (f.length > 3 && f[2].equals(Integer.toString(uid))) {
        return parse(f[3]);
      }
    }
    return Caller.UNKNOWN;
  }

  /** The groups that list the uid's user name as a member. */
  static Set<Integer> groupsOf(int uid) {
    String user = null;
    for (String line : IdentityPolicy.lines(Path.of("/etc/passwd"))) {
      String[] f = line.split(":", -1);
      if (f.length > 2 && f[2].equals(Integer.toString(uid))) {
        user = f[0];
        break;
      }
    }
    Set<Integer> groups = new HashSet<>();
    if (user == null) {
      return groups;
    }
    for (String line : IdentityPolicy.lines(Path.of("/etc/group"))) {
      String[] f = line.split(":", -1);
      if (f.length > 3 && Set.of(f[3].split(",")).contains(user)) {
        groups.add(parse(f[2]));
      }
    }
    return groups;
  }

  /** A group's gid from a name or a number, or {@link Caller#UNKNOWN}. */
  public static int gidOf(String group) {
    if (group.chars().allMatch(Character::isDigit) && !group.isEmpty()) {
      return Integer.parseInt(group);
    }
    for (String line : IdentityPolicy.lines(Path.of("/etc/group"))) {
      String[] f = line.split(":", -1);
      if (f.length > 2 && f[0].equals(group)) {
        return parse(f[2]);
      }
    }
    return Caller.UNKNOWN;
  }

  private static int parse(String number) {
    try {
      return Integer.parseInt(number);
    } catch (NumberFormatException e) {
      return Caller.UNKNOWN;
    }
  }
}
