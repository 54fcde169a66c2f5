package io.gpumemd.server.backend;

import java.io.IOException;

/**
 * A segment that clients map through a file descriptor the daemon hands them over the fd
 * channel ({@link IpcHandle.HostFd}), never through a path: only a process that was given a
 * descriptor can map it, and its mapping outlives the daemon.
 *
 * <p>Implementations are thread-safe: {@link #open} may race with the backend freeing the
 * segment, and then answers null rather than a descriptor of whatever reused the number.
 */
public interface DescriptorSegment extends SegmentMemory {
  /**
   * A new descriptor of the segment for one reply; the caller sends it and closes it.
   *
   * @param readOnly open it read-only ({@code O_RDONLY}): its holder can map it {@code
   *     PROT_READ} only
   * @return null when the segment has been freed
   * @throws IOException when it cannot be opened (out of descriptors, say)
   */
  SegmentDescriptor open(boolean readOnly) throws IOException;
}
