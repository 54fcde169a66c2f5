package io.gpumemd.server.backend;

import java.io.IOException;

/**
 * A segment that clients map through a file descriptor the daemon hands them over the fd
 * channel ({@link IpcHandle.HostFd}, {@link IpcHandle.CudaVmm}), never through a path or a
 * PID-bound handle: only a process that was given a descriptor can map it, and its mapping
 * outlives the daemon.
 *
 * <p>Implementations are thread-safe: {@link #open} may race with the backend freeing the
 * segment, and then answers null rather than a descriptor of whatever reused the number.
 */
public interface FdPassedSegment extends SegmentMemory {
  /**
   * A new descriptor of the segment for one reply; the caller sends it and closes it.
   *
   * @param readOnly open it read-only where the descriptor can carry that: a host file's is
   *     {@code O_RDONLY}, mappable {@code PROT_READ} only; a CUDA VMM export has no mode, and the
   *     grant's read-only flag tells the client to map it with read-only access
   * @return null when the segment has been freed
   * @throws IOException when it cannot be opened (out of descriptors, say)
   */
  SegmentFd open(boolean readOnly) throws IOException;
}
