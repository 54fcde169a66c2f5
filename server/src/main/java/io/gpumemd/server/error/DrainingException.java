package io.gpumemd.server.error;

/** The server is shutting down and takes no new sessions or leases. */
public final class DrainingException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public DrainingException(String message) {
    super(message);
  }
}
