package io.gpumemd.server.session;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.books.LeaseBook;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.sharing.SharedObjects;

/**
 * The session registry's rooms as one value, for what works on all of them at once: its restore
 * ({@link SessionsRestorer}) is handed this instead of eight parts one by one. The registry owns
 * every part; the record only names them, and is as thread-safe as each part is.
 *
 * @param pools the pools the sessions lease from
 * @param settings this daemon's session configuration (quotas, TTL bound, client cache cap)
 * @param ticker the clock
 * @param sessions the live sessions by id
 * @param directory the tenants
 * @param book the lease records
 * @param sharing share tokens, published names and shared blocks
 * @param churn the opened and ended counts of the churn window
 */
record RegistryRooms(DevicePools pools, SessionSettings settings, Ticker ticker, LiveSessions sessions,
    SessionDirectory directory, LeaseBook book, SharedObjects sharing, SessionChurn churn) {}
