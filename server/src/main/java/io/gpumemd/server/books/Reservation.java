package io.gpumemd.server.books;

import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;

/**
 * The places one lease or hold in the making takes in the bounds of its session and its
 * tenant: for a lease, its rounded bytes and one lease against both quotas; for a hold, one
 * hold against both bounds. {@link LeaseBook} commits it into the session's record; {@link
 * #close} gives the places back when that never happened, so each failure path is the end of
 * one try-with-resources block, not rollback code of its own.
 *
 * <p>A lease that needs the backend is reserved once, on the transport thread, and its
 * reservation handed to the backend executor with the rest of the request.
 *
 * <p>Not thread-safe: one thread at a time owns it.
 */
public final class Reservation implements AutoCloseable {
  private final LeaseHolder session;
  /** The rounded bytes of a lease; -1 for a hold. */
  private final long bytes;
  private boolean settled;

  private Reservation(LeaseHolder session, long bytes) {
    this.session = session;
    this.bytes = bytes;
  }

  /**
   * Reserves quota for a lease of {@code roundedBytes}: the session's, then its tenant's.
   *
   * @param pinnedBytes released memory the tenant's processes may still map, which its byte
   *     quota counts besides its leases ({@code DevicePools#pinnedBytes})
   *
   * @throws ExhaustedException naming the quota that would be exceeded, having taken nothing
   * @throws NotFoundException when the session has ended
   */
  public static Reservation forLease(LeaseHolder session, long roundedBytes, Quota tenantQuota, long pinnedBytes) {
    try {
      session.reserve(roundedBytes);
    } catch (IllegalStateException e) {
      throw ended(session);
    }
    try {
      session.tenantUsage().reserve(roundedBytes, pinnedBytes, tenantQuota, session);
    } catch (ExhaustedException e) {
      session.unreserve(roundedBytes);
      throw e;
    }
    return new Reservation(session, roundedBytes);
  }

  /**
   * Reserves a hold: a place among the session's holds, then among its tenant's (0 = no bound),
   * so that a tenant's many sessions do not multiply the session bound.
   *
   * @throws ExhaustedException at either bound, having taken nothing
   * @throws NotFoundException when the session has ended
   */
  public static Reservation forHold(LeaseHolder session, int maxPerSession, int maxPerTenant) {
    try {
      session.reserveHold(maxPerSession);
    } catch (IllegalStateException e) {
      throw ended(session);
    }
    try {
      session.tenantUsage().reserveHold(maxPerTenant, session);
    } catch (ExhaustedException e) {
      session.unreserveHold();
      throw e;
    }
    return new Reservation(session, -1);
  }

  public static NotFoundException ended(LeaseHolder session) {
    return new NotFoundException("session " + session.id() + " has ended");
  }

  public LeaseHolder session() {
    return session;
  }

  boolean isHold() {
    return bytes < 0;
  }

  /**
   * Hands the places to {@code record}, now the session's: the session's own turn into what it
   * holds, the tenant's stay until the record is returned ({@link LeaseBook#returnBlock}).
   *
   * @return false when the session ended meanwhile: its places are given back, the tenant's
   *     stay with the record, which the caller must return
   */
  boolean commit(LeaseRecord record) {
    settled = true;
    return isHold() ? session.commitHold(record) : session.commit(record, bytes);
  }

  /** Gives every place back, unless committed. Idempotent. */
  @Override
  public void close() {
    if (settled) {
      return;
    }
    settled = true;
    if (isHold()) {
      session.unreserveHold();
      session.tenantUsage().unreserveHold();
    } else {
      session.unreserve(bytes);
      session.tenantUsage().unreserve(bytes);
    }
  }
}
