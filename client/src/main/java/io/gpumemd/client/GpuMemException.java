package io.gpumemd.client;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;

/**
 * The one exception the client library throws for failed calls: it keeps the gRPC status code
 * and the server's message (e.g. RESOURCE_EXHAUSTED with the pool's state).
 */
public final class GpuMemException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final Status.Code code;

  public GpuMemException(Status.Code code, String message, Throwable cause) {
    super(code + ": " + message, cause);
    this.code = code;
  }

  /** The gRPC status code, e.g. {@code RESOURCE_EXHAUSTED}. */
  public Status.Code code() {
    return code;
  }

  /** The server's message without the code prefix. */
  public String serverMessage() {
    String m = getMessage();
    return m.substring(m.indexOf(": ") + 2);
  }

  static GpuMemException from(Throwable t) {
    if (t instanceof GpuMemException e) {
      return e;
    }
    Status status = Status.fromThrowable(t);
    String description = status.getDescription() != null ? status.getDescription()
        : t instanceof StatusRuntimeException ? status.getCode().name() : String.valueOf(t);
    return new GpuMemException(status.getCode(), description, t);
  }
}
