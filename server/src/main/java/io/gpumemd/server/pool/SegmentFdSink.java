package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;

/**
 * Where {@link DevicePool#snapshot} puts the descriptor of each segment it writes down: the
 * caller passes them on (with {@code SCM_RIGHTS}) in the order they were added, and the snapshot
 * names each segment's by that index ({@link PoolSnapshot.SegmentSnapshot#descriptorIndex}). One
 * sink may serve every pool, so indexes run on across devices.
 *
 * <p>The sink owns every descriptor added, also when the export is refused afterwards: it sends
 * and closes them, or just closes them.
 */
@FunctionalInterface
public interface SegmentFdSink {
  /**
   * Takes a descriptor of the segment on {@code memory}.
   *
   * @return its index among every descriptor this sink took (0, 1, 2, ...)
   */
  int add(SegmentMemory memory, SegmentFd descriptor);

  /**
   * The index of {@code memory}'s descriptor when it was sent ahead of the state ({@link
   * DevicePools#segmentsAhead}): no descriptor is opened for it then.
   *
   * @return its index, or -1 when it was not sent ahead
   */
  default int sentAhead(SegmentMemory memory) {
    return -1;
  }
}
