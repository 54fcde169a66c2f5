package io.gpumemd.server.backend;

/**
 * Who a segment belongs to. Placeholder until the pool's isolation work lands.
 *
 * @param key the owner's key (a tenant, or a session id under per-session isolation)
 * @param uid the uid its files should belong to, or -1
 * @param gid the gid its files should belong to, or -1
 */
public record SegmentOwner(String key, int uid, int gid) {
  public static final SegmentOwner DAEMON = new SegmentOwner("", -1, -1);
}
