package io.gpumemd.server.error;

/** The caller is identified but may not do this (an admin verb without admin rights): PERMISSION_DENIED. */
public final class PermissionDeniedException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public PermissionDeniedException(String message) {
    super(message);
  }
}
