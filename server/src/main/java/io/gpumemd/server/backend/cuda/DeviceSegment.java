package io.gpumemd.server.backend.cuda;

import io.gpumemd.server.backend.SegmentMemory;
import jcuda.driver.CUdeviceptr;

/**
 * A CUDA segment as the daemon reaches it: at a device address in its own context, where {@code
 * cuMemsetD8} zeroes it, whichever way clients map it ({@link CudaSegment}, {@link VmmSegment}).
 */
sealed interface DeviceSegment extends SegmentMemory permits CudaSegment, VmmSegment {
  /** Its base address in the daemon's context of its device. */
  CUdeviceptr pointer();
}
