package io.gpumemd.server.backend;

/**
 * The device (or the host's shared-memory file system) has no room for an allocation. The pool
 * treats it like a budget miss: evict cached segments, retry once, then refuse the lease.
 */
public final class BackendOutOfMemoryException extends BackendException {
  private static final long serialVersionUID = 1L;

  public BackendOutOfMemoryException(String message) {
    super(message);
  }
}
