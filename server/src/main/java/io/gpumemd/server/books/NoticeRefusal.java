package io.gpumemd.server.books;

import io.gpumemd.server.error.GpumemdException;

/**
 * A cache notice the daemon did not apply, and why (the exception carries the status the
 * client is told, e.g. NOT_FOUND for a lease that is not the session's, RESOURCE_EXHAUSTED
 * beyond the client cache allowance).
 */
public record NoticeRefusal(String leaseId, GpumemdException reason) {}
