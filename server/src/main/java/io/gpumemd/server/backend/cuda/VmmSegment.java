package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;

import io.gpumemd.common.cuda.VmmDriver;
import io.gpumemd.server.backend.DescriptorSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentDescriptor;
import java.io.IOException;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUresult;

/**
 * One CUDA VMM allocation ({@code cuMemCreate}, POSIX file descriptor handle type), mapped
 * read-write in the daemon's own context at {@link #pointer} so that the backend zeroes it as it
 * does a {@code cuMemAlloc}. Clients get it as descriptors that {@link #open} exports, each a new
 * one for one reply of the fd channel ({@link IpcHandle.CudaVmm}). Made and released by {@link
 * VmmAllocations}.
 *
 * <p>An exported descriptor holds the allocation on its own: the driver frees the memory once
 * the daemon has released its handle and every descriptor and importer's mapping is gone.
 *
 * <p>Thread-safety: {@link #open} and {@link #markReleased} are ordered by this object's
 * monitor, so nothing is exported from a handle the daemon has released.
 */
final class VmmSegment implements DeviceSegment, DescriptorSegment {
  private final int device;
  private final long bytes;
  private final CUcontext context;
  /** The driver's {@code CUmemGenericAllocationHandle}. */
  private final long allocation;
  private final CUdeviceptr pointer;
  private final IpcHandle.CudaVmm handle;
  private boolean released; // guarded by this

  VmmSegment(int device, long bytes, CUcontext context, long allocation,
      CUdeviceptr pointer, IpcHandle.CudaVmm handle) {
    this.device = device;
    this.bytes = bytes;
    this.context = context;
    this.allocation = allocation;
    this.pointer = pointer;
    this.handle = handle;
  }

  @Override
  public int device() {
    return device;
  }

  @Override
  public long bytes() {
    return bytes;
  }

  @Override
  public IpcHandle handle() {
    return handle;
  }

  @Override
  public CUdeviceptr pointer() {
    return pointer;
  }

  /** The daemon's handle of the allocation, for {@link VmmAllocations#release}. */
  long allocation() {
    return allocation;
  }

  /**
   * A new POSIX file descriptor of the allocation ({@code cuMemExportToShareableHandle}). It
   * carries no access mode: {@code readOnly} is what the grant tells the client, which then
   * maps it with read-only access ({@code FdGrant.read_only}).
   */
  @Override
  public synchronized SegmentDescriptor open(boolean readOnly) throws IOException {
    if (released) {
      return null;
    }
    int current = cuCtxSetCurrent(context);
    if (current != CUresult.CUDA_SUCCESS) {
      throw new IOException("cuCtxSetCurrent(" + device + ") failed: " + CUresult.stringFor(current));
    }
    int[] fd = new int[1];
    int result = VmmDriver.exportDescriptor(allocation, fd);
    if (result != CUresult.CUDA_SUCCESS) {
      // Out of descriptors surfaces as a CUDA error; FdGrants maps this message's EMFILE case.
      throw new IOException("cuMemExportToShareableHandle on device " + device + " failed: "
          + CUresult.stringFor(result));
    }
    return SegmentDescriptor.ofNative(fd[0], readOnly);
  }

  /**
   * Marks the allocation released, so that {@link #open} exports nothing more.
   *
   * @return false when it already was
   */
  synchronized boolean markReleased() {
    if (released) {
      return false;
    }
    released = true;
    return true;
  }

  @Override
  public String toString() {
    return "CUDA VMM segment of " + bytes + " bytes on device " + device;
  }
}
