package io.gpumemd.common;

/**
 * The size rounding and classes of gpumemd's pools, after PyTorch's CUDA caching allocator: the
 * one table that the daemon's pools, the Java client's cache tier and gpumemctl all use.
 *
 * <pre>
 *  request (after rounding up to 512 B)   pool    segment allocated on a miss     split rule on lease
 *  ------------------------------------   -----   ---------------------------     ---------------------------
 *  512 B .. 1 MiB                         small   2 MiB, shared by many blocks    split when >= 512 B remain
 *  &gt; 1 MiB                                 large   the request rounded to 2 MiB    split when &gt; 1 MiB remains
 * </pre>
 *
 * A cached block more than {@code maxOversizeBytes} larger than a large request is not used
 * for it, so one huge free segment is not chopped up for small neighbours; a small request only
 * ever takes a block of a small segment. {@code maxOversizeBytes} is the daemon's
 * {@code --max-oversize-bytes} (default {@link #DEFAULT_MAX_OVERSIZE}), which it tells each
 * client in {@code OpenSessionResponse.max_oversize_bytes}, so that a client cache picks the
 * blocks the daemon would.
 *
 * <p>All methods are pure functions; the class is thread-safe.
 */
public final class SizeClasses {
  /** Every block size is a multiple of this. */
  public static final long ALIGNMENT = 512;
  /** Largest request served from the small pool. */
  public static final long SMALL_MAX = 1L << 20;
  /** Segment size of the small pool; large segments are rounded to the same granule. */
  public static final long SEGMENT_GRANULE = 2L << 20;
  /** Default most bytes a cached large block may exceed the request by. */
  public static final long DEFAULT_MAX_OVERSIZE = 20L << 20;

  private SizeClasses() {}

  /** Rounds a request up to the 512-byte alignment. The caller ensures {@code size > 0}. */
  public static long roundUp(long size) {
    return (size + ALIGNMENT - 1) & -ALIGNMENT;
  }

  /** True when a rounded size is served from the small pool. */
  public static boolean isSmall(long rounded) {
    return rounded <= SMALL_MAX;
  }

  /** Bytes of the segment allocated for a rounded size on a miss. */
  public static long segmentBytes(long rounded) {
    return isSmall(rounded) ? SEGMENT_GRANULE : (rounded + SEGMENT_GRANULE - 1) & -SEGMENT_GRANULE;
  }

  /** True when a free block of {@code blockSize} handed out for {@code rounded} is split. */
  public static boolean shouldSplit(long blockSize, long rounded) {
    long remainder = blockSize - rounded;
    return isSmall(rounded) ? remainder >= ALIGNMENT : remainder > SMALL_MAX;
  }

  /**
   * The largest cached block that may serve a rounded request: one small segment for a small
   * request, the request plus {@code maxOversizeBytes} for a large one.
   */
  public static long largestFit(long rounded, long maxOversizeBytes) {
    return isSmall(rounded) ? SEGMENT_GRANULE : rounded + maxOversizeBytes;
  }
}
