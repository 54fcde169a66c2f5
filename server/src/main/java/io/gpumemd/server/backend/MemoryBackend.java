package io.gpumemd.server.backend;

import java.util.List;

/**
 * Source of device memory for the pools: allocates and frees whole segments, zeroes ranges,
 * and opens clients' completion events. Knows nothing of blocks, leases or sessions.
 *
 * <p>Implementations are thread-safe: the pools call them from any thread, concurrently, and
 * always outside their locks (every call here may take milliseconds).
 */
public interface MemoryBackend extends AutoCloseable {
  /** {@code host} or {@code cuda}. */
  String name();

  /** The devices this backend serves, ordinals 0..n-1, fixed at start. */
  List<DeviceInfo> devices();

  /**
   * Allocates one segment of exactly {@code bytes} (a multiple of {@link #segmentGranularity})
   * on a device for one owner. A backend whose
   * segments are files makes them openable by the owner's user where it can ({@link
   * SegmentOwner#uid()}); others ignore the owner. The pool, not the backend, keeps segments of
   * different owners apart.
   *
   * @throws BackendOutOfMemoryException when the device has no room
   * @throws BackendException on any other failure
   */
  SegmentMemory allocate(int device, long bytes, SegmentOwner owner);

  /**
   * The size every segment on a device must be a multiple of (CUDA VMM: the allocation
   * granularity, 2 MiB on an H100); the pool rounds new segments up to it. 1 when any size will
   * do. Fixed at start.
   */
  default long segmentGranularity(int device) {
    return 1;
  }

  /**
   * Bytes of the device in use that this backend's live segments do not explain (other
   * processes, driver contexts, freed segments still mapped elsewhere), or -1 where the backend
   * cannot tell. A gauge for operators: memory the daemon's budget cannot see.
   */
  default long bytesOutsideBooks(int device) {
    return -1;
  }

  /** Gives a segment back. Never throws for a segment this backend allocated; logs instead. */
  void free(SegmentMemory segment);

  /** Writes zeros over {@code [offset, offset + length)} of a segment. */
  void zero(SegmentMemory segment, long offset, long length);

  /**
   * Host memory of {@code bytes} to keep segment contents in while their device memory is freed
   * (parking, sleep). Backends that cannot keep contents refuse.
   *
   * @throws BackendOutOfMemoryException when the host has no room for it
   * @throws BackendException when this backend cannot keep contents in host memory
   */
  default HostBuffer allocateHost(long bytes) {
    throw new BackendException("the " + name() + " backend cannot keep segment contents in host memory");
  }

  /**
   * Copies {@code [offset, offset + length)} of a segment into a host buffer at {@code
   * hostOffset}; returns once the bytes are in the buffer. The caller keeps the segment's range
   * still meanwhile (no client writes it: its holder is paused, or it maps nothing).
   */
  default void copyToHost(SegmentMemory segment, long offset, HostBuffer host, long hostOffset, long length) {
    throw new BackendException("the " + name() + " backend cannot keep segment contents in host memory");
  }

  /**
   * Copies {@code length} bytes of a host buffer at {@code hostOffset} into a segment at {@code
   * offset}; returns once a client that maps the segment would read them.
   */
  default void copyFromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    throw new BackendException("the " + name() + " backend cannot keep segment contents in host memory");
  }

  /**
   * True when a freshly allocated segment is known to read as zeros. When false (CUDA: {@code
   * cuMemAlloc} may return bytes another owner wrote), the pool zeroes every new segment before
   * handing out any of it.
   */
  boolean freshSegmentsAreZeroed();

  /**
   * True when releases may carry completion events ({@link #openEvent} can succeed), so that
   * the server polls them; false on the host backend.
   */
  boolean supportsCompletionEvents();

  /**
   * Opens a client's 64-byte CUDA IPC event handle on a device.
   *
   * @throws InvalidEventHandleException when the backend has no events (host) or the handle
   *     is not a valid event handle
   */
  CompletionEvent openEvent(int device, byte[] ipcEventHandle);

  /**
   * True when clients map this backend's segments through file descriptors that the daemon's fd
   * channel hands them ({@link FdPassedSegment}), so that the daemon must serve that channel.
   */
  default boolean passesDescriptors() {
    return false;
  }

  // ------------------------------------------------------------------------------ take-over

  /**
   * Why this backend cannot hand its segments to a successor daemon ({@code gpumemd
   * --take-over}) or adopt a predecessor's, in words an operator acts on; null when it can
   * ({@link #relinquish}, {@link #adopt}). Fixed at start.
   */
  default String takeOverRefusal() {
    return "the " + name() + " backend cannot hand its segments over to another daemon";
  }

  /**
   * True when each device is a piece of hardware that {@link DeviceInfo#uuid} names and an
   * ordinal does not (a CUDA GPU: ordinals follow {@code CUDA_VISIBLE_DEVICES}): a take-over then
   * hands device n's memory over only to a successor whose device n has the same UUID. False
   * where devices are budgets over one memory (host), which a take-over matches by ordinal.
   */
  default boolean devicesMatchByUuid() {
    return false;
  }

  /**
   * Adopts a segment a predecessor daemon handed over as a descriptor (one its {@link
   * FdPassedSegment#open} made, received with {@code SCM_RIGHTS}): the segment is this
   * backend's from now on, freed by {@link #free} or handed on by {@link #relinquish}, and counts
   * against the device's capacity.
   *
   * <p>Takes ownership of {@code fd}: it is closed (or kept as the segment's own) whether the
   * call succeeds or throws.
   *
   * @param bytes the segment's size as the predecessor's state says; checked where the
   *     descriptor tells
   * @throws BackendOutOfMemoryException when the device's capacity has no room for it
   * @throws BackendException when the descriptor is not such a segment or cannot be adopted
   * @throws UnsupportedOperationException when {@link #takeOverRefusal} is not null
   */
  default SegmentMemory adopt(int device, int fd, long bytes) {
    throw new UnsupportedOperationException(String.valueOf(takeOverRefusal()));
  }

  /**
   * Drops this process's references to a segment without destroying its memory: a successor
   * adopted it from a descriptor ({@link #adopt}) and keeps it. The segment is no longer this
   * backend's (as after {@link #free}), and {@link FdPassedSegment#open} answers null.
   *
   * @throws UnsupportedOperationException when {@link #takeOverRefusal} is not null
   */
  default void relinquish(SegmentMemory segment) {
    throw new UnsupportedOperationException(String.valueOf(takeOverRefusal()));
  }

  /** Frees whatever the backend still holds (segments, files, contexts). Idempotent. */
  @Override
  void close();
}
