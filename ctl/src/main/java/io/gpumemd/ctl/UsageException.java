package io.gpumemd.ctl;

/**
 * A command line that cannot be run as written (unknown flag, missing or malformed value):
 * {@code gpumemctl} prints the message and exits 2, without contacting the daemon.
 */
final class UsageException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  UsageException(String message) {
    super(message);
  }

  /** {@code name: value (expected: what)}, the project's message form for bad input. */
  static UsageException of(String name, String value, String expected) {
    return new UsageException(name + ": " + value + " (expected: " + expected + ")");
  }
}
