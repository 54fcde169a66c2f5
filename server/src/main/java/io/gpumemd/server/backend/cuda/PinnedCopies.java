package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuMemFreeHost;
import static jcuda.driver.JCudaDriver.cuMemHostAlloc;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;

import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.RangeCheckedHostBuffer;
import io.gpumemd.server.backend.SegmentMemory;
import jcuda.Pointer;

/**
 * The CUDA backend's copies between device segments and host buffers. Host buffers are
 * page-locked ({@code cuMemHostAlloc}, portable to every context): the copy engines read and
 * write them directly, where pageable memory would be staged through a driver buffer at a
 * fraction of the bus's speed. The copies are {@code cuMemcpyDtoH}/{@code cuMemcpyHtoD}, which
 * return once the bytes have arrived, so a copy out is complete before the segment's memory is
 * given to anyone else, and a copy in before its holder maps it again.
 *
 * <p>The caller makes the segment's device context current. Stateless and thread-safe.
 */
final class PinnedCopies {
  /** {@code CU_MEMHOSTALLOC_PORTABLE}: the memory counts as pinned in every context, not just the allocating one. */
  private static final int PORTABLE = 0x01;

  private PinnedCopies() {}

  static HostBuffer allocate(long bytes) {
    Pointer host = new Pointer();
    CudaCalls.check(cuMemHostAlloc(host, bytes, PORTABLE), "cuMemHostAlloc(" + bytes + ")");
    return new PinnedBuffer(host, bytes);
  }

  static void toHost(SegmentMemory segment, long offset, HostBuffer host, long hostOffset, long length) {
    PinnedBuffer pinned = RangeCheckedHostBuffer.checked(host, PinnedBuffer.class, hostOffset, length);
    DeviceSegment device = (DeviceSegment) segment;
    CudaCalls.check(cuMemcpyDtoH(pinned.host.withByteOffset(hostOffset), device.pointer().withByteOffset(offset), length),
        "cuMemcpyDtoH(" + length + ") from device " + segment.device());
  }

  static void fromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    PinnedBuffer pinned = RangeCheckedHostBuffer.checked(host, PinnedBuffer.class, hostOffset, length);
    DeviceSegment device = (DeviceSegment) segment;
    CudaCalls.check(cuMemcpyHtoD(device.pointer().withByteOffset(offset), pinned.host.withByteOffset(hostOffset), length),
        "cuMemcpyHtoD(" + length + ") to device " + segment.device());
  }

  /** Page-locked memory from {@code cuMemHostAlloc}. */
  private static final class PinnedBuffer extends RangeCheckedHostBuffer {
    private final Pointer host;

    PinnedBuffer(Pointer host, long bytes) {
      super(bytes);
      this.host = host;
    }

    @Override
    protected void release() {
      CudaCalls.check(cuMemFreeHost(host), "cuMemFreeHost");
    }
  }
}
