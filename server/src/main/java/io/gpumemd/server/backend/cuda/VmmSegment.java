package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;

import io.gpumemd.common.cuda.VmmDriver;
import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.ErrnoCalls;
import io.gpumemd.server.backend.AbstractFdPassedSegment;
import io.gpumemd.server.backend.DescriptorExhaustedException;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentFd;
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
 * <p>An allocation adopted from a running daemon ({@code --take-over}) keeps the descriptor it
 * came by, and every descriptor it hands out is a duplicate of that one: the driver exports only
 * allocations the process created itself ({@code cuMemExportToShareableHandle} on an imported
 * handle failed on an H200, driver 580, so a successor could hand none of its adopted segments
 * to a client). Each adopted segment holds one descriptor of the daemon for its life.
 *
 * <p>Thread-safety: {@link #open} and {@link #markReleased} are ordered by this object's
 * monitor ({@link AbstractFdPassedSegment}), so nothing is exported from a handle the daemon has
 * released.
 */
final class VmmSegment extends AbstractFdPassedSegment implements DeviceSegment {
  private final CUcontext context;
  /** The driver's {@code CUmemGenericAllocationHandle}. */
  private final long allocation;
  private final CUdeviceptr pointer;
  /** The descriptor an adopted allocation came by, -1 for one this daemon created; guarded by this. */
  private int adoptedFrom;

  VmmSegment(int device, long bytes, CUcontext context, long allocation,
      CUdeviceptr pointer, IpcHandle.CudaVmm handle, int adoptedFrom) {
    super(device, bytes, handle);
    this.context = context;
    this.allocation = allocation;
    this.pointer = pointer;
    this.adoptedFrom = adoptedFrom;
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
   * A new POSIX file descriptor of the allocation ({@code cuMemExportToShareableHandle}, or a
   * duplicate of the one an adopted allocation came by). It carries no access mode: {@code
   * readOnly} is what the grant tells the client, which then maps it with read-only access
   * ({@code FdGrant.read_only}).
   */
  @Override
  protected SegmentFd openLive(boolean readOnly) throws IOException {
    if (adoptedFrom >= 0) {
      return own(duplicate(), readOnly, SegmentFd::ofNative);
    }
    int current = cuCtxSetCurrent(context);
    if (current != CUresult.CUDA_SUCCESS) {
      throw new IOException("cuCtxSetCurrent(" + device() + ") failed: " + CUresult.stringFor(current));
    }
    int[] fd = new int[1];
    int result = VmmDriver.exportDescriptor(allocation, fd);
    if (result != CUresult.CUDA_SUCCESS) {
      throw exportFailed(result);
    }
    return own(fd[0], readOnly, SegmentFd::ofNative);
  }

  /**
   * What a failed {@code cuMemExportToShareableHandle} means. The driver documents no error for
   * a process out of descriptors; it answers {@code CUDA_ERROR_OUT_OF_MEMORY} (or {@code
   * CUDA_ERROR_OPERATING_SYSTEM}) when the descriptor cannot be made. So the daemon asks the
   * kernel itself: when it cannot open a descriptor either, RLIMIT_NOFILE is the cause, and the
   * request is refused RESOURCE_EXHAUSTED saying so; a driver out of memory is RESOURCE_EXHAUSTED
   * too; anything else is the daemon's fault (INTERNAL).
   */
  IOException exportFailed(int result) {
    String call = "cuMemExportToShareableHandle on device " + device() + " failed: " + CUresult.stringFor(result);
    if (result != CUresult.CUDA_ERROR_OUT_OF_MEMORY && result != CUDA_ERROR_OPERATING_SYSTEM) {
      return new IOException(call);
    }
    if (!canOpenDescriptor()) {
      return outOfDescriptors(call + ", and the daemon cannot open a descriptor either");
    }
    if (result == CUresult.CUDA_ERROR_OUT_OF_MEMORY) {
      return new DescriptorExhaustedException(call + " (the driver has no memory for another export); retry later");
    }
    return new IOException(call);
  }

  /** The refusal of a daemon out of descriptors, {@code cause} saying which call found it so. */
  private static DescriptorExhaustedException outOfDescriptors(String cause) {
    return new DescriptorExhaustedException("gpumemd has no file descriptor left to hand segment memory out (" + cause
        + "): its RLIMIT_NOFILE must exceed its live segments, descriptors in flight and connections; retry later, or "
        + "raise the daemon's limit (LimitNOFILE=, ulimit -n)");
  }

  /**
   * A duplicate of the adopted descriptor; out of descriptors (EMFILE, ENFILE) is refused as an
   * export that found none is.
   */
  private int duplicate() throws IOException {
    try {
      return Descriptors.dup(adoptedFrom);
    } catch (ErrnoCalls.ErrnoException e) {
      if (e.outOfDescriptors()) {
        throw outOfDescriptors("dup of an adopted allocation's descriptor on device " + device() + ": "
            + e.getMessage());
      }
      throw e;
    }
  }

  /** {@code CUDA_ERROR_OPERATING_SYSTEM}, which JCuda 12.0.0's {@code CUresult} names too. */
  private static final int CUDA_ERROR_OPERATING_SYSTEM = 304;

  /** Whether this process can open one more descriptor now (it closes it at once). */
  static boolean canOpenDescriptor() {
    try (java.nio.channels.FileChannel probe = java.nio.channels.FileChannel.open(java.nio.file.Path.of("/dev/null"))) {
      return true;
    } catch (IOException e) {
      return false;
    }
  }

  /**
   * Marks the allocation released, so that {@link #open} exports nothing more.
   *
   * @return false when it already was
   */
  boolean markReleased() {
    if (!markGone()) {
      return false;
    }
    synchronized (this) {
      if (adoptedFrom >= 0) {
        Descriptors.closeQuietly(adoptedFrom); // no open can run any more: markGone ordered it
        adoptedFrom = -1;
      }
    }
    return true;
  }

  @Override
  public String toString() {
    return "CUDA VMM segment of " + bytes() + " bytes on device " + device();
  }
}
