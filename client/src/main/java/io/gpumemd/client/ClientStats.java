package io.gpumemd.client;

/**
 * What this client's cache tier and lease path did since it connected. An immutable snapshot.
 *
 * @param localHits leases served from the client's own cache, without a round trip
 * @param localReturns closed leases kept in the client's cache instead of released
 * @param daemonLeases leases the daemon served (one round trip each)
 * @param releases leases released to the daemon
 * @param cachedBytes bytes (block sizes) in the client's cache now
 * @param cachedBlocks blocks in the client's cache now
 * @param allowanceBytes the cache allowance the daemon grants now (0 = no client cache)
 */
public record ClientStats(long localHits, long localReturns, long daemonLeases, long releases,
    long cachedBytes, long cachedBlocks, long allowanceBytes) {}
