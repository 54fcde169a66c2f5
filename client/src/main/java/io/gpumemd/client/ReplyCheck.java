package io.gpumemd.client;

import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.MemoryHandle;
import io.grpc.Status;

/**
 * What this process checks of the daemon's word before it maps or touches memory (DESIGN's rule
 * 7): a lease's or hold's sizes and offset ({@link #lease}), and the real size of what it is
 * about to map ({@link #segmentSize}: a descriptor's {@code fstat}, a segment file's size, a CUDA
 * allocation's range). A daemon can be wrong (a bug, a forged take-over, another version);
 * without these checks a buffer or device pointer handed to a framework would reach past the
 * mapping (SIGBUS, SIGSEGV) or into the next block.
 *
 * <p>Every failure is a {@link GpuMemException} coded INTERNAL (the code of the daemon's own
 * errors) whose message starts "the daemon's reply is inconsistent" and names the field and its
 * values. Callers check before anything is mapped, and give back what the daemon granted.
 *
 * <p>Stateless; thread-safe.
 */
final class ReplyCheck {
  static final String INCONSISTENT = "the daemon's reply is inconsistent: ";

  private ReplyCheck() {}

  /**
   * Checks a lease (or hold) reply: a memory handle, {@code block_bytes} covering {@code
   * size_bytes}, and the block {@code [offset, offset + block_bytes)} inside {@code [0,
   * segment_bytes)}, the sum taken without overflow.
   *
   * @param deviceAsked the device a lease asked for (ignored for a hold)
   * @param sizeAsked the bytes a lease asked for; 0 for a hold, which asks for no size
   * @throws GpuMemException INTERNAL naming the inconsistency
   */
  static void lease(LeaseResponse reply, int deviceAsked, long sizeAsked) {
    String what = (sizeAsked > 0 ? "lease " : "hold ") + reply.getLeaseId();
    MemoryHandle handle = reply.getHandle();
    if (!reply.hasHandle() || handle.getKindCase() == MemoryHandle.KindCase.KIND_NOT_SET) {
      throw inconsistent(what + " carries no memory handle");
    }
    what += " (segment " + Long.toUnsignedString(handle.getSegmentId()) + ")";
    long size = reply.getSizeBytes();
    long block = reply.getBlockBytes();
    long segment = handle.getSegmentBytes();
    long offset = handle.getOffset();
    if (sizeAsked > 0 && reply.getDevice() != deviceAsked) {
      throw inconsistent(what + ": device " + reply.getDevice() + " (expected: " + deviceAsked + ", the device asked)");
    }
    if (sizeAsked > 0 && size != sizeAsked) {
      throw inconsistent(what + ": size_bytes " + size + " (expected: " + sizeAsked + ", the size asked)");
    }
    if (size <= 0) {
      throw inconsistent(what + ": size_bytes " + size + " (expected: > 0)");
    }
    if (block < size) {
      throw inconsistent(what + ": block_bytes " + block + " is smaller than size_bytes " + size
          + (sizeAsked > 0 ? ", the size asked" : ""));
    }
    if (segment <= 0) {
      throw inconsistent(what + ": segment_bytes " + segment + " (expected: > 0)");
    }
    if (offset < 0) {
      throw inconsistent(what + ": offset " + offset + " (expected: >= 0)");
    }
    // offset + block could overflow; both are non-negative here, so compare with a difference.
    if (block > segment - offset) {
      throw inconsistent(what + ": offset + block_bytes = " + offset + " + " + block
          + " runs past segment_bytes " + segment);
    }
  }

  /**
   * Checks that what is about to be mapped has the size the daemon's reply gave it.
   *
   * @param what what was measured and how, e.g. "the descriptor of segment 3 (fstat)"
   * @param actual its real size
   * @param source where the expected size came from, e.g. "the fd channel's grant"
   * @param expected the size that source gave
   * @throws GpuMemException INTERNAL when they differ
   */
  static void segmentSize(String what, long actual, String source, long expected) {
    if (actual != expected) {
      throw inconsistent(what + " is " + actual + " bytes, " + source + " says segment_bytes " + expected);
    }
  }

  static GpuMemException inconsistent(String what) {
    return new GpuMemException(Status.Code.INTERNAL, INCONSISTENT + what, null);
  }
}
