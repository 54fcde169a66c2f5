package io.gpumemd.server.books;

import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import java.util.ArrayList;
import java.util.List;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What sessions' client cache tiers tell the daemon on their KeepAlive streams: leases closed
 * into the tier and handed out again (moving their bytes between leased and client-cached, in
 * the session and in the pool), and the tier's own counters. Nothing a client reports is
 * trusted into a shared figure: cached bytes are held to the session's allowance, counters are
 * validated per session and saturate.
 *
 * <p>Thread-safe: each session's state is guarded by the session, each pool's by the pool.
 */
public final class ClientCache {
  private static final Logger log = LoggerFactory.getLogger(ClientCache.class);

  private final DevicePools pools;
  private final LeaseBook book;

  public ClientCache(DevicePools pools, LeaseBook book) {
    this.pools = pools;
    this.book = book;
  }


  /**
   * The client closed leases into its cache tier (a batch of its notices). Each is counted as
   * client-cached only while the session's client-cached bytes stay within its allowance.
   *
   * @return the notices refused (unknown, another session's, already cached, beyond the
   *     allowance), each with why
   */
  public List<NoticeRefusal> cached(LeaseHolder session, List<String> leaseIds) {
    List<NoticeRefusal> refused = new ArrayList<>(0);
    for (String id : leaseIds) {
      LeaseRecord lease = book.own(session, id);
      LeaseHolder.CacheAnswer answer = lease == null ? LeaseHolder.CacheAnswer.NOT_CACHEABLE : session.markCached(lease);
      if (answer == LeaseHolder.CacheAnswer.OVER_ALLOWANCE) {
        refused.add(new NoticeRefusal(id, new ExhaustedException("lease " + id + " cannot be client-cached: "
            + session + " keeps " + session.clientCachedBytes() + " bytes cached and its block of "
            + lease.block().size() + " bytes would exceed the client cache allowance of " + session.cacheAllowance()
            + " bytes (granted at OpenSession; flag --client-cache-bytes); release it instead")));
        continue;
      }
      if (answer == LeaseHolder.CacheAnswer.NOT_CACHEABLE) {
        refused.add(new NoticeRefusal(id,
            new NotFoundException("lease " + id + " cannot be client-cached: not a leased block of this session")));
        continue;
      }
      try {
        pools.get(lease.block().device()).clientCached(lease.block(), session.id());
      } catch (IllegalStateException e) {
        // Released meanwhile by a unary Release (another HTTP/2 stream): nothing left to cache.
        session.markReused(lease);
        refused.add(new NoticeRefusal(id, new NotFoundException("lease " + id + " cannot be client-cached: it was released")));
      }
    }
    return refused;
  }

  /**
   * The client handed cached leases out again locally (a batch of its notices).
   *
   * @return the notices refused, each with why
   */
  public List<NoticeRefusal> reused(LeaseHolder session, List<String> leaseIds) {
    List<NoticeRefusal> refused = new ArrayList<>(0);
    for (String id : leaseIds) {
      LeaseRecord lease = book.own(session, id);
      if (lease == null || !session.markReused(lease)) {
        refused.add(new NoticeRefusal(id,
            new NotFoundException("lease " + id + " cannot be reused: not a client-cached lease of this session")));
        continue;
      }
      try {
        pools.get(lease.block().device()).clientReused(lease.block());
      } catch (IllegalStateException e) {
        refused.add(new NoticeRefusal(id, new NotFoundException("lease " + id + " cannot be reused: it was released")));
      }
    }
    return refused;
  }

  /**
   * The client's cumulative cache counters for a device; what is new goes to the pool's. A
   * negative value is not a count: it is ignored (with one DEBUG line), the other still counts.
   */
  public void clientCounters(LeaseHolder session, int device, long hits, long returns) {
    DevicePool pool = pools.get(device);
    if (hits < 0 || returns < 0) {
      log.debug("{}: ignored negative client cache counters for device {}: hits={}, returns={} (expected: >= 0)",
          session, device, hits, returns);
    }
    long[] delta = session.counterDeltas(device, hits, returns);
    if (delta[0] > 0 || delta[1] > 0) {
      pool.addClientCounters(delta[0], delta[1]);
    }
  }
}
