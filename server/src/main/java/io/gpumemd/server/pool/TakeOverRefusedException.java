package io.gpumemd.server.pool;

/**
 * A pool cannot be handed to a successor daemon now ({@link DevicePool#exportState}), or a
 * successor cannot rebuild it ({@link DevicePool#restore}). The message is the reason, in words
 * an operator acts on (it ends up in the take-over's {@code Refusal} or {@code Abort}); nothing
 * moved, and the holder carries on as before.
 */
public final class TakeOverRefusedException extends Exception {
  public TakeOverRefusedException(String reason) {
    super(reason);
  }

  public TakeOverRefusedException(String reason, Throwable cause) {
    super(reason, cause);
  }
}
