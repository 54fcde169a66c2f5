package io.gpumemd.server.takeover;

/**
 * The running daemon cannot hand over now, or the successor cannot restore what it was handed.
 * The message is the reason, in words an operator acts on (it ends up in the protocol's {@code
 * Refusal} or {@code Abort}); nothing moved, and the running daemon carries on as before.
 */
public final class TakeOverRefusedException extends Exception {
  public TakeOverRefusedException(String reason) {
    super(reason);
  }

  public TakeOverRefusedException(String reason, Throwable cause) {
    super(reason, cause);
  }
}
