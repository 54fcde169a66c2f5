package io.gpumemd.server.fd;

import java.util.concurrent.ConcurrentHashMap;

/**
 * Places of one kind (live connections, descriptors in flight) held per tenant on the fd
 * channel, each tenant up to a bound. A tenant's entry exists only while it holds a place, so
 * the map holds at most as many entries as the channel's own bound on that kind allows places.
 *
 * <p>Thread-safe: each take and give is one atomic update of the tenant's entry.
 */
final class TenantCounts {
  private final int bound;
  private final ConcurrentHashMap<String, Integer> held = new ConcurrentHashMap<>();

  /** @param bound places one tenant may hold; 0 = no bound */
  TenantCounts(int bound) {
    this.bound = bound;
  }

  int bound() {
    return bound;
  }

  /** Takes a place for {@code tenant}; false, taking none, when it holds its bound already. */
  boolean take(String tenant) {
    boolean[] taken = {false};
    held.compute(tenant, (t, n) -> {
      int count = n == null ? 0 : n;
      if (bound > 0 && count >= bound) {
        return n;
      }
      taken[0] = true;
      return count + 1;
    });
    return taken[0];
  }

  /** Gives back a place {@link #take} gave. */
  void give(String tenant) {
    held.computeIfPresent(tenant, (t, n) -> n <= 1 ? null : n - 1);
  }

  /** Places {@code tenant} holds now. */
  int held(String tenant) {
    return held.getOrDefault(tenant, 0);
  }
}
