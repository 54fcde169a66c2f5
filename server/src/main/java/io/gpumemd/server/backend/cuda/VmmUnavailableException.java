package io.gpumemd.server.backend.cuda;

import io.gpumemd.server.backend.BackendException;

/**
 * {@code --cuda-handles vmm} was asked for where it cannot work (the device lacks VMM or POSIX
 * file descriptor handles, or the daemon has no fd channel). Unlike other CUDA failures it never
 * makes {@code --backend auto} fall back to the host backend: the operator asked for VMM.
 */
public final class VmmUnavailableException extends BackendException {
  private static final long serialVersionUID = 1L;

  VmmUnavailableException(String message) {
    super(message);
  }
}
