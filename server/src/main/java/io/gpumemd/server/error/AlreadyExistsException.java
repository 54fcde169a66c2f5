package io.gpumemd.server.error;

/** The request would create something that exists already (a published name): ALREADY_EXISTS. */
public final class AlreadyExistsException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public AlreadyExistsException(String message) {
    super(message);
  }
}
