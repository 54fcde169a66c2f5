package io.gpumemd.server.error;

/**
 * Someone the daemon waited for did not answer within its bound (a client asked to sleep by an
 * admin): DEADLINE_EXCEEDED. Nothing changed.
 */
public final class TimedOutException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public TimedOutException(String message) {
    super(message);
  }
}
