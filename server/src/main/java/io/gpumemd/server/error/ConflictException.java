package io.gpumemd.server.error;

/**
 * The request is valid but the state forbids it (a second KeepAlive stream for a session that
 * already has a live one from another process): FAILED_PRECONDITION.
 */
public final class ConflictException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public ConflictException(String message) {
    super(message);
  }
}
