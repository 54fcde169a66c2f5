package io.gpumemd.server.error;

import io.gpumemd.server.backend.InvalidEventHandleException;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The one place where exceptions become gRPC statuses. Domain errors keep their message (it
 * is written for the caller); anything else becomes INTERNAL with a generic message, and its
 * cause is logged here, once, with the rpc that hit it. The gRPC services and the fd channel
 * both answer with it, so a refusal reads the same on either. Stateless and thread-safe.
 */
public final class StatusMapper {
  private static final Logger log = LoggerFactory.getLogger(StatusMapper.class);
  static final String INTERNAL_MESSAGE = "internal error in gpumemd; the server log has the cause";

  private StatusMapper() {}

  public static StatusRuntimeException toStatus(String rpc, Throwable error) {
    Status status;
    if (error instanceof InvalidRequestException || error instanceof InvalidEventHandleException) {
      status = Status.INVALID_ARGUMENT;
    } else if (error instanceof NotFoundException) {
      status = Status.NOT_FOUND;
    } else if (error instanceof ExhaustedException) {
      status = Status.RESOURCE_EXHAUSTED;
    } else if (error instanceof PermissionDeniedException) {
      status = Status.PERMISSION_DENIED;
    } else if (error instanceof AlreadyExistsException) {
      status = Status.ALREADY_EXISTS;
    } else if (error instanceof ConflictException) {
      status = Status.FAILED_PRECONDITION;
    } else if (error instanceof TimedOutException) {
      status = Status.DEADLINE_EXCEEDED;
    } else if (error instanceof DrainingException) {
      status = Status.UNAVAILABLE;
    } else if (error instanceof StatusRuntimeException sre) {
      return sre;
    } else {
      log.error("Unexpected failure in {}", rpc, error);
      return Status.INTERNAL.withDescription(INTERNAL_MESSAGE).asRuntimeException();
    }
    if (log.isDebugEnabled()) {
      log.debug("{} refused: {} {}", rpc, status.getCode(), error.getMessage());
    }
    return status.withDescription(error.getMessage()).asRuntimeException();
  }
}
