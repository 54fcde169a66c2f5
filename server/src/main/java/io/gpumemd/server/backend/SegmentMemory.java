package io.gpumemd.server.backend;

/**
 * One backend allocation: a shared-memory file or one {@code cuMemAlloc}. It carries the IPC
 * handle that clients use to map it. Created by {@link MemoryBackend#allocate}, owned by the
 * pool segment that wraps it, given back with {@link MemoryBackend#free}.
 *
 * <p>Implementations are immutable after construction and safe to read from any thread.
 */
public interface SegmentMemory {
  /** Device ordinal. */
  int device();

  /** Bytes of the allocation. */
  long bytes();

  /** What a client maps the segment with. */
  IpcHandle handle();
}
