/**
 * Sharing a leased block with other sessions of its tenant: share tokens ({@link
 * io.gpumemd.server.sharing.ShareToken}) and published names ({@link
 * io.gpumemd.server.sharing.PublishedObject}), made, used, listed and removed by {@link
 * io.gpumemd.server.sharing.SharedObjects}, which the gRPC services call directly.
 *
 * <p>Depends on the books ({@code books}: a token or name is a hold on a {@code SharedBlock}, a
 * session's hold is a {@code LeaseRecord}); the session layer answers its questions (a caller's
 * session, a tenant, draining) through {@link io.gpumemd.server.sharing.HolderDirectory}.
 */
package io.gpumemd.server.sharing;
