package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentFd;

/**
 * Where {@link DevicePool#exportState} puts the descriptor of each segment it exports: the
 * take-over sends them with {@code SCM_RIGHTS} in the order they were added, and the state names
 * each segment's by that index ({@code SegmentState.descriptor_index}). One sink may serve every
 * pool, so indexes run on across devices.
 *
 * <p>The sink owns every descriptor added, also when the export is refused afterwards: it sends
 * and closes them, or just closes them.
 */
@FunctionalInterface
public interface SegmentFdSink {
  /**
   * Takes a descriptor of one segment.
   *
   * @return its index among every descriptor this sink took (0, 1, 2, ...)
   */
  int add(SegmentFd descriptor);
}
