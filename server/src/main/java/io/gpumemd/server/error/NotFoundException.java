package io.gpumemd.server.error;

/** Unknown or ended session; unknown lease, lease of another session, or double release. */
public final class NotFoundException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public NotFoundException(String message) {
    super(message);
  }
}
