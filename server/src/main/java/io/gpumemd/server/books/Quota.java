package io.gpumemd.server.books;

/**
 * Per-session limits; 0 means unlimited.
 *
 * @param maxLeasedBytes most bytes a session may hold leased at once
 * @param maxLeases most leases a session may hold at once
 */
public record Quota(long maxLeasedBytes, long maxLeases) {
  public static final Quota UNLIMITED = new Quota(0, 0);
}
