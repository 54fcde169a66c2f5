package io.gpumemd.server.session;

import io.gpumemd.server.books.Reservation;
import io.gpumemd.server.pool.DevicePool;

/**
 * A lease request that has passed its checks and reserved its quota, not yet served: the
 * {@link SessionRegistry} serves it from the pool's cache on the transport thread, or, on a
 * miss, from the backend on a thread that may block, with the same reservation. {@link #close}
 * gives the quota back unless the lease was recorded.
 *
 * <p>Not thread-safe: one thread at a time owns it.
 */
public final class PendingLease implements AutoCloseable {
  private final Session session;
  final Reservation quota;
  final DevicePool pool;
  final long size;
  final boolean zero;
  final String tag;

  PendingLease(Session session, Reservation quota, DevicePool pool, long size, boolean zero, String tag) {
    this.session = session;
    this.quota = quota;
    this.pool = pool;
    this.size = size;
    this.zero = zero;
    this.tag = tag;
  }

  /** The session the lease is for (the reservation's). */
  Session session() {
    return session;
  }

  @Override
  public void close() {
    quota.close();
  }
}
