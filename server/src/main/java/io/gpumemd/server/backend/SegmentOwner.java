package io.gpumemd.server.backend;

import java.util.Objects;

/**
 * Whom a segment is allocated for: the unit of memory isolation between clients.
 *
 * <p>A segment serves one owner for its whole life. Its blocks are leased only to holders of that
 * owner, and when it is idle it may be freed through the backend but never handed to another
 * owner, because what a client has mapped (a CUDA IPC handle, an shm mmap) cannot be revoked: a
 * client that says it unmapped a segment may still hold it. Memory passes from one owner to
 * another only through a backend free and a new allocation, which the pool scrubs when the
 * backend does not hand out zeroed memory.
 *
 * <p>The {@code key} names the owner (a tenant such as {@code uid:1000}, or a session id when
 * the operator isolates every session); equal keys are the same owner. {@code uid} and {@code
 * gid} are the operating-system identity of the owner's clients, for backends whose segments are
 * files ({@code host}): the file is given to that user and group, whichever are known, so that
 * the owner's processes can map it. Each is -1 when unknown; with both unknown the backend
 * leaves the file as the daemon's.
 *
 * @param key the owner's name; the empty string for the daemon itself
 * @param uid the owner's user id, or -1
 * @param gid the owner's group id, or -1
 */
public record SegmentOwner(String key, int uid, int gid) {
  /** No tenant: memory that belongs to the daemon (tests, and callers without tenants). */
  public static final SegmentOwner DAEMON = new SegmentOwner("", -1, -1);

  public SegmentOwner {
    Objects.requireNonNull(key, "key");
    if (uid < -1) {
      throw new IllegalArgumentException("uid: " + uid + " (expected: >= 0, or -1 for unknown)");
    }
    if (gid < -1) {
      throw new IllegalArgumentException("gid: " + gid + " (expected: >= 0, or -1 for unknown)");
    }
  }

  /** An owner known only by its key: the backend keeps its files as the daemon's. */
  public static SegmentOwner of(String key) {
    return new SegmentOwner(key, -1, -1);
  }
}
