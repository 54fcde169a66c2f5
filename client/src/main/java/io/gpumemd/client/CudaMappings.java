package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuIpcCloseMemHandle;
import static jcuda.driver.JCudaDriver.cuIpcOpenMemHandle;
import static jcuda.driver.JCudaDriver.cuMemGetAddressRange;
import static jcuda.driver.JCudaDriver.cuMemsetD8;

import io.gpumemd.common.cuda.CudaHandles;
import java.util.ArrayList;
import java.util.List;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUipcMemHandle;
import jcuda.driver.CUipcMem_flags;

/**
 * The CUDA side of the client's mappings: a segment opened in this process, by a legacy IPC
 * handle ({@code cuIpcOpenMemHandle}) or as an imported VMM allocation ({@link CudaVmm}). This
 * class, {@link CudaContexts}, {@link CudaVmm} and {@link CudaLeases} are the only ones that
 * touch JCuda, and they are loaded only when a lease carries a CUDA handle, so a host-only
 * client never needs the CUDA natives.
 *
 * <p>Every driver call runs with the device's primary context pushed and popped ({@link
 * CudaContexts#in}): the caller's current context is never changed.
 *
 * <p>Thread-safe: a mapping closes once, under its own lock.
 */
final class CudaMappings {
  private CudaMappings() {}

  /**
   * A segment mapped in this process; {@link #base} is its device address here, valid in the
   * primary context of {@link #device} (this process's ordinal).
   */
  abstract static class CudaMapping implements SegmentMapping {
    final int device;
    final CUdeviceptr base;
    final boolean readOnly;
    private boolean closed;

    CudaMapping(int device, CUdeviceptr base, boolean readOnly) {
      this.device = device;
      this.base = base;
      this.readOnly = readOnly;
    }

    /**
     * Waits for the work queued in the device's context, which may still use the memory, then
     * unmaps. Each step is tried even when an earlier one failed, so that nothing is left open
     * that could be closed; the first failure is thrown after, the others suppressed into it.
     */
    @Override
    public final synchronized void close() {
      if (closed) {
        return;
      }
      closed = true;
      List<RuntimeException> failures = new ArrayList<>(1);
      CudaContexts.run(device, () -> {
        attempt(failures, () -> CudaContexts.check(() -> cuCtxSynchronize(), "cuCtxSynchronize before unmapping"));
        unmap(failures);
      });
      if (!failures.isEmpty()) {
        RuntimeException first = failures.get(0);
        failures.subList(1, failures.size()).forEach(first::addSuppressed);
        throw first;
      }
    }

    @Override
    public int cudaDevice() {
      return device;
    }

    synchronized boolean isClosed() {
      return closed;
    }

    /** Undoes the mapping, the context pushed; each step through {@link #attempt}. */
    abstract void unmap(List<RuntimeException> failures);
  }

  /** Runs a step of an unmap, recording its failure instead of ending the unmap. */
  static void attempt(List<RuntimeException> failures, Runnable step) {
    try {
      step.run();
    } catch (RuntimeException e) {
      failures.add(e);
    }
  }

  /** A segment opened from its legacy 64-byte IPC handle. */
  static final class LegacyMapping extends CudaMapping {
    LegacyMapping(int device, CUdeviceptr base) {
      super(device, base, false); // a legacy handle cannot be opened read-only
    }

    @Override
    void unmap(List<RuntimeException> failures) {
      attempt(failures, () -> CudaContexts.check(() -> cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle"));
    }
  }

  /**
   * Opens a segment's legacy IPC handle on a device of this process (CUDA allows one open per
   * context: {@link MappingCache} keeps it per segment), and checks that the allocation opened
   * (its range, {@code cuMemGetAddressRange}) starts at the address opened and covers {@code
   * segmentBytes}, within which the lease's reply was checked to lie; else the handle is closed
   * again and the call fails INTERNAL: a device pointer past the allocation would let a kernel
   * write into whatever lies beyond.
   */
  static SegmentMapping openLegacy(int localDevice, byte[] handleBytes, long segmentId, long segmentBytes) {
    CUipcMemHandle handle = CudaHandles.memHandle(handleBytes);
    return CudaContexts.in(localDevice, () -> {
      CUdeviceptr base = new CUdeviceptr();
      CudaContexts.check(() -> cuIpcOpenMemHandle(base, handle, CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
          "cuIpcOpenMemHandle on device " + localDevice);
      try {
        CUdeviceptr rangeBase = new CUdeviceptr();
        long[] rangeBytes = new long[1];
        CudaContexts.check(() -> cuMemGetAddressRange(rangeBase, rangeBytes, base), "cuMemGetAddressRange");
        long opened = CudaHandles.address(base);
        if (CudaHandles.address(rangeBase) != opened || rangeBytes[0] < segmentBytes) {
          throw ReplyCheck.inconsistent("the CUDA allocation of segment " + Long.toUnsignedString(segmentId)
              + " opened from its IPC handle is " + rangeBytes[0] + " bytes at 0x" + Long.toHexString(opened)
              + " (its range starts at 0x" + Long.toHexString(CudaHandles.address(rangeBase))
              + "), the lease's reply says segment_bytes " + segmentBytes);
        }
      } catch (RuntimeException e) {
        CudaContexts.result(() -> cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle");
        throw e;
      }
      return new LegacyMapping(localDevice, base);
    });
  }

  /**
   * Waits for all work of this process queued in {@code localDevice}'s primary context: what may
   * still use the memory of its mappings (a lease's stream must belong to that context).
   *
   * @throws GpuMemException when the synchronize fails (a sticky error of the context)
   */
  static void synchronize(int localDevice) {
    CudaContexts.run(localDevice, () -> CudaContexts.check(() -> cuCtxSynchronize(), "cuCtxSynchronize"));
  }

  /** Writes zeros over {@code bytes} bytes at {@code offset} of a mapped segment (synchronous). */
  static void zero(SegmentMapping mapping, long offset, long bytes) {
    CudaMapping cuda = (CudaMapping) mapping;
    CudaContexts.run(cuda.device, () -> {
      CudaContexts.check(() -> cuMemsetD8(pointer(mapping, offset), (byte) 0, bytes), "cuMemsetD8");
      CudaContexts.check(() -> cuCtxSynchronize(), "cuCtxSynchronize");
    });
  }

  /** A device pointer {@code offset} bytes into a mapped segment: the one place of that sum. */
  static CUdeviceptr pointer(SegmentMapping mapping, long offset) {
    return ((CudaMapping) mapping).base.withByteOffset(offset);
  }
}
