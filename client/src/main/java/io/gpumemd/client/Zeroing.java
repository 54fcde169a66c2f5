package io.gpumemd.client;

import java.nio.ByteBuffer;

/**
 * Zeroes a lease the client cache hands out for a {@code zero} request, as the daemon would
 * have: the whole block (its block bytes, not only the bytes requested: a caller may use all of
 * {@link Lease#blockBytes()}), over the host mapping or with one {@code cuMemsetD8} on the
 * device (JCuda is loaded only for a CUDA lease). Stateless and thread-safe.
 */
final class Zeroing {
  private static final byte[] ZEROS = new byte[64 << 10];

  private Zeroing() {}

  static void zero(Lease lease) {
    if (lease.isHost()) {
      ByteBuffer memory = lease.blockBuffer();
      while (memory.hasRemaining()) {
        memory.put(ZEROS, 0, Math.min(ZEROS.length, memory.remaining()));
      }
    } else {
      CudaMappings.zero(lease.mapping(), lease.offset(), lease.blockBytes());
    }
  }
}
