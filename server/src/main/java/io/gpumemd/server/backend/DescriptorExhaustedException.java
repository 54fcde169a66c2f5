package io.gpumemd.server.backend;

import java.io.IOException;

/**
 * A segment's descriptor could not be made for want of a resource that comes back by itself:
 * the daemon's file descriptors ({@code RLIMIT_NOFILE}), or the driver's memory for an export.
 * The fd channel refuses the request {@code RESOURCE_EXHAUSTED} with this message, written for
 * an operator; nothing about the segment is wrong.
 */
public final class DescriptorExhaustedException extends IOException {
  private static final long serialVersionUID = 1L;

  public DescriptorExhaustedException(String message) {
    super(message);
  }
}
