/**
 * The session lifecycle: opening sessions within their limits, their KeepAlive streams, TTL and
 * grace, and their end, which returns everything they held ({@link
 * io.gpumemd.server.session.SessionRegistry}, the facade the gRPC services and the fd channel
 * call; {@link io.gpumemd.server.session.Session}); and the layer's snapshot and restore as plain
 * records ({@link io.gpumemd.server.session.SessionsSnapshot}), which {@code takeover} maps to the
 * wire.
 *
 * <p>On top of {@code books} (leases, quotas) and {@code sharing} (tokens, names), which it
 * creates and drives (a session's end, the reaper, shutdown).
 */
package io.gpumemd.server.session;
