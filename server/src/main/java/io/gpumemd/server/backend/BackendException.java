package io.gpumemd.server.backend;

/**
 * A backend call failed for a reason other than lack of memory: a driver error, an I/O error
 * on the shared-memory directory. The message names the call and the error; it is logged by
 * the server and never sent to clients.
 */
public class BackendException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public BackendException(String message) {
    super(message);
  }

  public BackendException(String message, Throwable cause) {
    super(message, cause);
  }
}
