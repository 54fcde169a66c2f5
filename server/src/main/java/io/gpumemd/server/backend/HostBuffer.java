package io.gpumemd.server.backend;

/**
 * Host memory a backend allocated ({@link MemoryBackend#allocateHost}) to keep segment contents
 * in while their device memory is free for others: a parked object's bytes, a sleeping
 * session's leases. It is filled and emptied only through the backend that allocated it ({@link
 * MemoryBackend#copyToHost}, {@link MemoryBackend#copyFromHost}), which alone knows what kind of
 * memory it is: the CUDA backend's is page-locked, so its copies run on the copy engines at the
 * bus's speed; the host backend's is plain anonymous memory of the daemon.
 *
 * <p>Thread-safety: {@link #free()} is idempotent and safe from any thread; copies into or out of
 * one buffer are the caller's to keep apart, and no copy may run after or during {@code free()}.
 */
public interface HostBuffer {
  /** Its length in bytes, as asked for. */
  long bytes();

  /** Gives the memory back; later calls do nothing. */
  void free();
}
