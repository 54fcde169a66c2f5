package io.gpumemd.client;

/**
 * A process-local mapping of one segment: a mapped shared-memory file (host) or an opened CUDA
 * IPC handle. Created once per segment by {@link MappingCache} and shared by every lease on it.
 */
interface SegmentMapping {
  /** Unmaps. Any buffer or pointer derived from the mapping becomes invalid. */
  void close();

  /**
   * This process's CUDA device the mapping lives on, whose work may still use its memory; -1
   * for a host mapping. (A method, not an {@code instanceof}, so that a host-only client never
   * loads the CUDA classes.)
   */
  default int cudaDevice() {
    return -1;
  }

  /**
   * Whether the mapping can let its memory go and keep its address range ({@link #vacate}): host
   * and CUDA VMM mappings; not a legacy CUDA IPC handle, which the driver opens where it chooses.
   */
  default boolean vacatable() {
    return false;
  }

  /**
   * Lets the segment go and keeps the address range, inaccessible (sleep): every buffer or
   * pointer made from the mapping keeps its address until the range is filled again. Does
   * nothing when vacated.
   */
  default void vacate() {
    throw new UnsupportedOperationException("this mapping cannot keep its address without its memory");
  }
}
