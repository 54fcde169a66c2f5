package io.gpumemd.server.error;

/** A budget, quota or the device memory is exhausted; the message states the pool or quota. */
public final class ExhaustedException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public ExhaustedException(String message) {
    super(message);
  }
}
