package io.gpumemd.server.pool;

/**
 * A process that was sent a segment's descriptor over the fd channel, as a holder of that
 * segment: it may map the segment whatever its session does, so the pool keeps the segment (and
 * counts its bytes) until the process is known to reach it no more (see {@code
 * fd/DescriptorPins}, which decides that). Unlike a session, such a holder is never asked to
 * unmap: a process has no channel to answer on but its session's.
 *
 * <p>In the pool's books a holder is a string ({@link HolderMappings}); this record is the
 * string's meaning, so that the holder survives a snapshot and restore as the other holders do (the
 * restoring daemon parses it back and watches the process).
 *
 * @param pid the process, as {@code SO_PEERCRED} named it when it connected; 0 for a process in
 *     a PID namespace the daemon cannot see, which it follows by pidfd
 * @param startTicks its start time ({@code /proc/PID/stat} field 22): a pid reused by another
 *     process is a different holder; for pid 0, the process's pidfs inode (one per process for
 *     as long as the system runs)
 * @param session the session it fetched the descriptor for; that session's unmap confirmation
 *     speaks for the process too
 * @param tenant the tenant whose books carry what the process keeps after its session ended
 */
public record DescriptorHolder(int pid, long startTicks, String session, String tenant) {
  private static final String PREFIX = "fd:";

  public DescriptorHolder {
    if (pid < 0 || startTicks < 0 || session.indexOf(':') >= 0) {
      throw new IllegalArgumentException("descriptor holder: pid " + pid + ", start " + startTicks
          + ", session '" + session + "'");
    }
  }

  /** The holder's key in the pool's books: {@code fd:PID:START:SESSION:TENANT} (the tenant last: it may hold ':'). */
  public String key() {
    return PREFIX + pid + ':' + startTicks + ':' + session + ':' + tenant;
  }

  /** True when a holder key names a process (not a session). */
  public static boolean isKey(String holder) {
    return holder.startsWith(PREFIX);
  }

  /**
   * The holder a key names.
   *
   * @throws IllegalArgumentException when it is not a key made by {@link #key}
   */
  public static DescriptorHolder parse(String key) {
    String[] parts = key.split(":", 5);
    if (parts.length != 5 || !(parts[0] + ':').equals(PREFIX)) {
      throw new IllegalArgumentException("not a descriptor holder: '" + key + "'");
    }
    try {
      return new DescriptorHolder(Integer.parseInt(parts[1]), Long.parseLong(parts[2]), parts[3], parts[4]);
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("not a descriptor holder: '" + key + "'", e);
    }
  }
}
