package io.gpumemd.server.sharing;

import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.error.AlreadyExistsException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.error.PermissionDeniedException;
import io.gpumemd.server.pool.DevicePool;

/**
 * What sharing answers when it refuses, in one place so that every call refusing the same thing
 * says it the same way: an unknown, expired or foreign token or name is NOT_FOUND with the same
 * words (nothing is probeable), a bound names its flag. Stateless.
 */
final class Refusals {
  private Refusals() {}

  static ExhaustedException sharesAtBound(String tenantKey, int max) {
    return new ExhaustedException("tenant " + tenantKey + " has " + max + " live share tokens and published names "
        + "(flag --max-shares-per-tenant); revoke tokens or unpublish objects it no longer needs");
  }

  static ExhaustedException overPublishedLimit(DevicePool pool, long bytes) {
    return new ExhaustedException("device " + pool.device().ordinal() + ": publishing " + bytes
        + " bytes would pass the published-bytes limit of " + pool.publishedLimitBytes()
        + " (flag --max-published-bytes); unpublish objects no longer needed");
  }

  static PermissionDeniedException notAdmin(String what, Caller caller) {
    return new PermissionDeniedException(what + " needs an admin identity (root, the daemon's uid, a member of "
        + "--admin-group, or an admin token); " + caller.principal() + " is not one");
  }

  static NotFoundException tokenNotFound() {
    return new NotFoundException("share token not found (unknown, expired, revoked or used up)");
  }

  static NotFoundException objectNotFound(String name) {
    return new NotFoundException("object '" + name + "' not found (never published, or unpublished)");
  }

  static NotFoundException released(String leaseId) {
    return new NotFoundException("lease " + leaseId + " was released meanwhile");
  }

  static AlreadyExistsException exists(String name) {
    return new AlreadyExistsException("object '" + name + "' is already published by this tenant; unpublish it "
        + "first or choose another name");
  }
}
