package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;

/**
 * A segment whose descriptor a take-over sends ahead of the state, while this daemon still serves
 * ({@link DevicePools#segmentsAhead}): the successor adopts it meanwhile, and the state names it by
 * the index it was sent at if it is still there ({@link SegmentFdSink#sentAhead}).
 *
 * @param memory the segment's memory, by which the export knows it again
 * @param descriptor a new descriptor of it, the caller's to send and close
 */
public record SegmentAhead(int device, long id, long bytes, SegmentMemory memory, SegmentFd descriptor) {}
