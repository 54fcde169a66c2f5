package io.gpumemd.server.error;

/**
 * Base of the domain errors that a caller caused or can act on. Each subclass maps to one
 * gRPC status in {@code StatusMapper}; the message is written for a person and is sent to the
 * client as it is, so it must never carry internal detail that the caller has no business with.
 *
 * <p>The domain (pool, backends, sessions) throws these and knows nothing of gRPC. Anything
 * else that escapes a service is unexpected and becomes INTERNAL.
 */
public abstract class GpumemdException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  protected GpumemdException(String message) {
    // No stack trace: these are user errors, logged (if at all) without one.
    super(message, null, false, false);
  }
}
