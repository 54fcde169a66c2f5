package io.gpumemd.server.books;

import io.gpumemd.server.backend.SegmentMemory;

/**
 * What a session holds in one segment, as the fd channel asks it ({@code
 * SessionRegistry#holding}, from {@link LeaseHolder#holding}): the segment's memory, and whether the session may write to it.
 * Immutable.
 *
 * @param segmentId the segment
 * @param memory its backend allocation
 * @param writable true when the session holds a lease on a block of it, or a hold that is not
 *     read-only; false when all it holds there are read-only holds
 */
public record SegmentHolding(long segmentId, SegmentMemory memory, boolean writable) {}
