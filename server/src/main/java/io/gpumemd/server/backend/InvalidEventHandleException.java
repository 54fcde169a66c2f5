package io.gpumemd.server.backend;

/**
 * A client's completion-event handle cannot be used: the backend has no events (host), or the
 * driver refuses to open it. The client's fault, unlike other {@link BackendException}s: the
 * message is written for the caller and names the field, {@code cuda_ipc_event_handle: …
 * (expected: …)}.
 */
public final class InvalidEventHandleException extends BackendException {
  private static final long serialVersionUID = 1L;

  public InvalidEventHandleException(String value, String expected) {
    super("cuda_ipc_event_handle: " + value + " (expected: " + expected + ")");
  }
}
