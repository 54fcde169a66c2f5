/**
 * The lease books: every lease and hold a session has ({@link io.gpumemd.server.books.LeaseBook},
 * {@link io.gpumemd.server.books.LeaseRecord}), what one session holds against its quota and
 * its client cache allowance ({@link io.gpumemd.server.books.LeaseHolder}), the places a lease
 * or hold takes before it is made ({@link io.gpumemd.server.books.Reservation}), a tenant's
 * quota and bounds ({@link io.gpumemd.server.books.Tenant}), the holds on a shared block ({@link
 * io.gpumemd.server.books.SharedBlock}), and the client cache tier's notices and counters ({@link
 * io.gpumemd.server.books.ClientCache}, the daemon's side of the clients' {@code ClientCache}).
 *
 * <p>Below the session lifecycle ({@code session}) and sharing ({@code sharing}); depends on the
 * pool and the backends only. A block goes back to its pool here, whoever ends its last hold.
 */
package io.gpumemd.server.books;
