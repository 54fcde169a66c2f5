package io.gpumemd.client;

import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.common.cuda.VmmDriver;
import java.util.List;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUresult;

/**
 * CUDA VMM segments in this process ({@code MemoryHandle.cuda_vmm}): the segment's POSIX file
 * descriptor, received from the fd channel, is imported ({@code
 * cuMemImportFromShareableHandle}), a range of addresses of the segment's size is reserved
 * ({@code cuMemAddressReserve}), the allocation mapped there ({@code cuMemMap}) and made
 * accessible to the device ({@code cuMemSetAccess}): read-write, or read-only for a read-only
 * grant, which the driver then enforces (a kernel's write faults); to the lease's device and to
 * every device of this process that {@code cuDeviceCanAccessPeer} says can reach it, with the
 * same flags, as a legacy handle opened with {@code CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS} lets
 * peers in, so that the two modes differ in nothing a kernel sees ({@link
 * CudaContexts#accessors}). Unmapping is the reverse:
 * {@code cuMemUnmap}, {@code cuMemAddressFree}, {@code cuMemRelease} of the imported handle
 * (after {@link CudaMappings.CudaMapping#close()} has waited for queued work). The calls are
 * those of {@code vmm_reference.py}, checked on an H100.
 *
 * <p>{@code cuMemSetAccess} goes through JNA to {@code libcuda.so.1} (the same library JCuda's
 * natives link, so the same driver state), not through JCuda: JCuda 12.0.0's binding reads the
 * access descriptor's location fields from the descriptor object itself instead of its {@code
 * location} (its {@code getCUmemAccessDescs} passes the wrong object to {@code GetIntField}; the
 * shipped {@code libJCudaDriver-12.0.0-linux-x86_64.so} does the same), so the driver would get
 * the access flags as the location type and an object reference's bits as the device: an
 * invalid argument at best. The descriptor is built here: {@code CUmemAccessDesc} is {@code
 * {int type; int id;}} then {@code int flags}, 12 bytes.
 *
 * <p>Stateless; thread-safe.
 */
final class CudaVmm {
  private CudaVmm() {}

  /**
   * A VMM allocation imported and mapped in this process, in an address range it keeps from
   * mapping to close: {@link #vacate} unmaps and releases the allocation and keeps the range
   * reserved ({@code cuMemUnmap}, {@code cuMemRelease}; no {@code cuMemAddressFree}), {@link
   * #refill} maps a newly imported allocation of the same size at the same address ({@code
   * cuMemMap}, {@code cuMemSetAccess} with the mapping's access), so every device pointer made
   * from it stays valid through both. A kernel touching the range while it is vacated faults.
   */
  static final class VmmMapping extends CudaMappings.CudaMapping {
    private final long bytes;
    /** The imported allocation mapped at {@link #base}; 0 while vacated. Guarded by this. */
    private long handle;

    VmmMapping(int device, long address, long handle, long bytes, boolean readOnly) {
      super(device, new CUdeviceptr().withByteOffset(address), readOnly);
      this.handle = handle;
      this.bytes = bytes;
    }

    @Override
    void unmap(List<RuntimeException> failures) {
      long address = CudaHandles.address(base);
      if (handle != 0) {
        CudaMappings.attempt(failures, () -> CudaContexts.check(() -> VmmDriver.unmap(address, bytes), "cuMemUnmap"));
        CudaMappings.attempt(failures, () -> CudaContexts.check(() -> VmmDriver.release(handle), "cuMemRelease"));
      }
      CudaMappings.attempt(failures, () -> CudaContexts.check(() -> VmmDriver.addressFree(address, bytes),
          "cuMemAddressFree"));
    }

    @Override
    public boolean vacatable() {
      return true;
    }

    /** True between {@link #vacate} and {@link #refill}. */
    synchronized boolean vacated() {
      return handle == 0;
    }

    /**
     * Waits for the work queued in the device's context (it may still use the memory), then
     * unmaps and releases the allocation, keeping the range: this process no longer holds the
     * memory (the daemon may free it). Does nothing when vacated.
     */
    @Override
    public synchronized void vacate() {
      checkOpen();
      if (handle == 0) {
        return;
      }
      long address = CudaHandles.address(base);
      CudaContexts.run(device, () -> {
        CudaContexts.check(() -> jcuda.driver.JCudaDriver.cuCtxSynchronize(), "cuCtxSynchronize before vacating");
        CudaContexts.check(() -> VmmDriver.unmap(address, bytes), "cuMemUnmap");
      });
      long released = handle;
      handle = 0; // unmapped: from here the range is vacated, whatever the release says
      CudaContexts.run(device, () -> CudaContexts.check(() -> VmmDriver.release(released), "cuMemRelease"));
    }

    /**
     * Imports a segment's descriptor (the caller's to close) and maps it at this mapping's
     * address, with this mapping's access, to the same devices: a vacated range gets memory
     * again, the same allocation or another of the same size. On a failure the range stays
     * vacated and nothing is left imported.
     */
    synchronized void refill(int fd, long segmentId) {
      checkOpen();
      if (handle != 0) {
        throw new IllegalStateException("the CUDA VMM mapping at 0x" + Long.toHexString(CudaHandles.address(base))
            + " is not vacated: the driver maps only into an unmapped range");
      }
      long address = CudaHandles.address(base);
      handle = CudaContexts.in(device, () -> {
        long[] imported = new long[1];
        CudaContexts.check(() -> VmmDriver.importDescriptor(fd, imported), "cuMemImportFromShareableHandle");
        VmmDriver.Mapped mapped = VmmDriver.mapAt(address, imported[0], bytes, CudaContexts.accessors(device),
            readOnly ? VmmDriver.PROT_READ : VmmDriver.PROT_READWRITE);
        if (!mapped.ok()) {
          CudaContexts.result(() -> VmmDriver.release(imported[0]), "cuMemRelease");
          throw refused(mapped, segmentId, bytes, readOnly);
        }
        return imported[0];
      });
    }

    private void checkOpen() {
      if (isClosed()) {
        throw new IllegalStateException("segment mapping is closed");
      }
    }
  }

  /**
   * Imports a segment's descriptor on a device of this process and maps all of it ({@link
   * VmmDriver#mapWhole}, as the daemon maps its own). The descriptor stays the caller's to close
   * (the import does not take it over; the mapping does not need it). On failure, whatever was
   * done is undone.
   *
   * @param readOnly map with read-only access (a read-only grant, or a read-only hold)
   */
  static SegmentMapping importSegment(int localDevice, int fd, long segmentId, long segmentBytes, boolean readOnly) {
    return CudaContexts.in(localDevice, () -> {
      long[] imported = new long[1];
      CudaContexts.check(() -> VmmDriver.importDescriptor(fd, imported), "cuMemImportFromShareableHandle");
      // The lease's device and its peers, as a legacy handle (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
      // lets them in: a kernel or copy on a peer GPU reaches the lease in either mode.
      VmmDriver.Mapped mapped = VmmDriver.mapWhole(imported[0], segmentBytes, CudaContexts.accessors(localDevice),
          readOnly ? VmmDriver.PROT_READ : VmmDriver.PROT_READWRITE);
      if (mapped.ok()) {
        return new VmmMapping(localDevice, mapped.address(), imported[0], segmentBytes, readOnly);
      }
      CudaContexts.result(() -> VmmDriver.release(imported[0]), "cuMemRelease");
      throw refused(mapped, segmentId, segmentBytes, readOnly);
    });
  }

  /** The failure of a map that {@link VmmDriver.Mapped} reports, as the caller sees it. */
  private static GpuMemException refused(VmmDriver.Mapped mapped, long segmentId, long segmentBytes, boolean readOnly) {
    // The driver refuses to map more than the imported allocation holds (cuMemMap: offset +
    // size within the allocation): its documented check is the allocation's size check, so
    // a refusal here means the reply's segment_bytes is not this allocation's.
    if (mapped.failedCall().equals("cuMemMap") && mapped.result() == CUresult.CUDA_ERROR_INVALID_VALUE) {
      return ReplyCheck.inconsistent("the CUDA VMM allocation of segment " + Long.toUnsignedString(segmentId)
          + " cannot be mapped whole at segment_bytes " + segmentBytes + " (cuMemMap: CUDA_ERROR_INVALID_VALUE: "
          + "the allocation is smaller, or segment_bytes is not a multiple of its granularity)");
    }
    String what = mapped.failedCall().equals("cuMemSetAccess")
        ? "cuMemSetAccess(" + (readOnly ? "read-only" : "read-write") + ")"
        : mapped.failedCall() + "(" + segmentBytes + ")";
    return CudaContexts.failed(what, mapped.result());
  }
}
