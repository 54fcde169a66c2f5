package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuMemFreeHost;
import static jcuda.driver.JCudaDriver.cuMemHostAlloc;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.SegmentMemory;
import java.util.concurrent.atomic.AtomicBoolean;
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
    PinnedBuffer pinned = checked(host, hostOffset, length);
    DeviceSegment device = (DeviceSegment) segment;
    CudaCalls.check(cuMemcpyDtoH(pinned.at(hostOffset), device.pointer().withByteOffset(offset), length),
        "cuMemcpyDtoH(" + length + ") from device " + segment.device());
  }

  static void fromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    PinnedBuffer pinned = checked(host, hostOffset, length);
    DeviceSegment device = (DeviceSegment) segment;
    CudaCalls.check(cuMemcpyHtoD(device.pointer().withByteOffset(offset), pinned.at(hostOffset), length),
        "cuMemcpyHtoD(" + length + ") to device " + segment.device());
  }

  private static PinnedBuffer checked(HostBuffer host, long hostOffset, long length) {
    if (!(host instanceof PinnedBuffer pinned)) {
      throw new BackendException("a host buffer of another backend: " + host);
    }
    if (hostOffset < 0 || length < 0 || hostOffset + length > pinned.bytes) {
      throw new BackendException("[" + hostOffset + ", +" + length + ") is outside a host buffer of " + pinned.bytes + " bytes");
    }
    return pinned;
  }

  /** Page-locked memory from {@code cuMemHostAlloc}; freed once. */
  private static final class PinnedBuffer implements HostBuffer {
    private final Pointer host;
    private final long bytes;
    private final AtomicBoolean freed = new AtomicBoolean();

    PinnedBuffer(Pointer host, long bytes) {
      this.host = host;
      this.bytes = bytes;
    }

    Pointer at(long offset) {
      if (freed.get()) {
        throw new BackendException("pinned host buffer used after it was freed");
      }
      return host.withByteOffset(offset);
    }

    @Override
    public long bytes() {
      return bytes;
    }

    @Override
    public void free() {
      if (freed.compareAndSet(false, true)) {
        CudaCalls.check(cuMemFreeHost(host), "cuMemFreeHost");
      }
    }

    @Override
    public String toString() {
      return "pinned host buffer of " + bytes + " bytes";
    }
  }
}
