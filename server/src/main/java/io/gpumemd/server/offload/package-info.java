/**
 * Contents of device memory kept in host memory while the device memory serves others: the
 * room of sleep and wake (issue 35). Built so far: the bounded {@link
 * io.gpumemd.server.offload.HostStore} and its {@link io.gpumemd.server.offload.ParkedRange}s,
 * over the backends' host buffers and copies ({@code MemoryBackend#allocateHost}, {@code
 * copyToHost}, {@code copyFromHost}). Not built yet: the sleep and wake calls, parking of
 * published objects, their flags, metrics and admin commands.
 *
 * <h2>The design the rest follows</h2>
 *
 * <p><b>What sleeps is whole segment mappings.</b> A client maps segments whole and a lease is a
 * slice of one; CUDA VMM cannot unmap part of a mapped range ({@code cuMemUnmap} takes what one
 * {@code cuMemMap} mapped), so a session's sleep covers every segment that holds one of the
 * leases it names, and with them every lease of that session in those segments (the reply lists
 * them). Each such mapping keeps its address range reserved in the client (issue 35 item 1), so
 * pointers, buffers and tensors survive. Legacy CUDA IPC mappings cannot be put at an address
 * of the client's choosing: a session on a legacy-handle device cannot sleep ({@code
 * FAILED_PRECONDITION}, naming {@code --cuda-handles vmm}).
 *
 * <p><b>Sleep, in order.</b> The caller has paused its work. The client gives back its
 * client-cached blocks, vacates its mappings of the segments (reservation kept, memory
 * inaccessible: a touch faults) and sends {@code Sleep(level, tags, vacated segments)}, which is
 * also its unmap confirmation for them. A shared lease's block is closed to new holds, and the
 * sleep waits up to {@code --unmap-wait-ms} for the other sessions' holds on it to be released
 * ({@code io.gpumemd.server.session.SharedSleep}). The daemon refuses, changing nothing, when a
 * hold is left at that deadline (holders named) or when level 1 would exceed {@code
 * --offload-max-bytes}: it {@link
 * io.gpumemd.server.offload.HostStore#claim claims} the bytes of every lease first, then parks
 * each (level 1) or parks nothing (level 2), marks the leases asleep and frees their blocks to
 * the pool; a segment left with no block in use and no mapper is freed to the device at once,
 * not kept in the pool's cache, so another tenant's lease can use the memory. Only then does
 * the reply go out.
 *
 * <p><b>Wake.</b> For each slept segment the daemon takes a segment of the same size: the old
 * one when the session's blocks in it are still free, else a new one, in which the session's
 * leases are carved at their old offsets (the rest is free memory of the pool). It copies each
 * lease's parked bytes back (level 1) or zeroes them (level 2), drops the parked ranges, and
 * replies with the segment each old one became; the client maps each into the old reserved
 * range, so every lease is at its old address with its old bytes. A wake that cannot get the
 * memory is refused with {@code RESOURCE_EXHAUSTED} and the session stays asleep.
 *
 * <p><b>Everything else keeps its word.</b> While asleep, the session keeps its leases, quotas,
 * shares and names; a lease on it is {@code FAILED_PRECONDITION} naming the sleep, and so is an
 * Attach or Lookup of a block that sleeps, whose tokens and names follow it to its new block at
 * the wake. A sleeping
 * session that ends (or whose process dies) drops its parked ranges with its leases after the
 * grace period, as it frees leases today. A take-over while a session sleeps is refused, naming
 * the sleeping sessions: pinned host memory cannot pass to another process, and a successor
 * that re-read gigabytes would stretch the pause the take-over exists to keep short. A daemon
 * restart loses parked contents with the sessions, as today.
 *
 * <p><b>Parking a published object</b> is the same for one block whose only holders are its
 * names ({@code io.gpumemd.server.sharing.ObjectParking}): parked to the store, its block freed
 * (its segment to the device when left unused and unmapped); the next lookup leases a block for
 * the looking session's owner, restores the bytes into it and only then holds it and replies (the
 * looker maps whatever the reply names: unlike a wake, the address need not be the old one).
 * The block's residency lock orders parks, restores and the drop of its last name, so concurrent
 * lookups restore once. With {@code --park-idle-objects}, a lease short of budget first parks
 * idle objects, least recently looked up first ({@code io.gpumemd.server.pool.BudgetRelief}).
 * A take-over is refused while an object is parked, as while a session sleeps.
 */
package io.gpumemd.server.offload;
