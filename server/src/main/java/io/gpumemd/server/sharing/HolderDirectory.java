package io.gpumemd.server.sharing;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.books.LeaseHolder;
import io.gpumemd.server.books.Tenant;

/**
 * What sharing needs of the session layer before it acts: a caller's live session, the tenants,
 * and whether the daemon still takes new holds. The session layer implements it, so sharing
 * depends on the books and not on the sessions that own them.
 *
 * <p>Implementations are thread-safe.
 */
public interface HolderDirectory {
  /**
   * A live session of the caller's tenant by id; refreshes its TTL.
   *
   * @throws io.gpumemd.server.error.NotFoundException for another tenant's session as for an
   *     unknown one
   */
  LeaseHolder session(Caller caller, String sessionId);

  /** Whose segments a session's leases come from (a parked object restored for it too). */
  SegmentOwner segmentOwner(LeaseHolder session);

  /** The holdings of a tenant by key (created on first use). */
  Tenant tenant(String key);

  /** @throws io.gpumemd.server.error.DrainingException when the daemon takes no new holds */
  void checkNotDraining();
}
