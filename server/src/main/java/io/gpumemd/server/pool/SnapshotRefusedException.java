package io.gpumemd.server.pool;

/**
 * A pool cannot be written down now ({@link DevicePool#snapshot}), or a snapshot cannot be
 * rebuilt here ({@link DevicePool#restore}). The message is the reason, in words an operator
 * acts on; nothing moved, and the pool written down serves on as before.
 */
public final class SnapshotRefusedException extends Exception {
  public SnapshotRefusedException(String reason) {
    super(reason);
  }

  public SnapshotRefusedException(String reason, Throwable cause) {
    super(reason, cause);
  }
}
