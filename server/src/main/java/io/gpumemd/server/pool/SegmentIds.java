package io.gpumemd.server.pool;

/**
 * Segment ids carry their device in the top 16 bits, so that a segment id alone names one
 * segment daemon-wide and finds its pool. Stateless.
 */
final class SegmentIds {
  private static final int DEVICE_SHIFT = 48;

  private SegmentIds() {}

  /** First segment id of a device's pool. */
  static long base(int device) {
    return ((long) device << DEVICE_SHIFT) + 1;
  }

  /** Device a segment id belongs to. */
  static int deviceOf(long segmentId) {
    return (int) (segmentId >>> DEVICE_SHIFT);
  }
}
