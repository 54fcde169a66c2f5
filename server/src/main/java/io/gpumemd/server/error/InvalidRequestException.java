package io.gpumemd.server.error;

/** The request can never succeed as written: bad size, unknown device, malformed id. */
public final class InvalidRequestException extends GpumemdException {
  private static final long serialVersionUID = 1L;

  public InvalidRequestException(String message) {
    super(message);
  }

  /** Builds the conventional {@code name: value (expected: ...)} message. */
  public static InvalidRequestException of(String name, Object value, String expected) {
    return new InvalidRequestException(name + ": " + value + " (expected: " + expected + ")");
  }
}
