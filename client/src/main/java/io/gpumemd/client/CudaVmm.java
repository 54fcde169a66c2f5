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

  /** A VMM allocation imported and mapped in this process. */
  static final class VmmMapping extends CudaMappings.CudaMapping {
    private final long handle;
    private final long bytes;

    VmmMapping(int device, long address, long handle, long bytes, boolean readOnly) {
      super(device, new CUdeviceptr().withByteOffset(address), readOnly);
      this.handle = handle;
      this.bytes = bytes;
    }

    @Override
    void unmap(List<RuntimeException> failures) {
      long address = CudaHandles.address(base);
      CudaMappings.attempt(failures, () -> CudaContexts.check(() -> VmmDriver.unmap(address, bytes), "cuMemUnmap"));
      CudaMappings.attempt(failures, () -> CudaContexts.check(() -> VmmDriver.addressFree(address, bytes),
          "cuMemAddressFree"));
      CudaMappings.attempt(failures, () -> CudaContexts.check(() -> VmmDriver.release(handle), "cuMemRelease"));
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
      // The driver refuses to map more than the imported allocation holds (cuMemMap: offset +
      // size within the allocation): its documented check is the allocation's size check, so
      // a refusal here means the reply's segment_bytes is not this allocation's.
      if (mapped.failedCall().equals("cuMemMap") && mapped.result() == CUresult.CUDA_ERROR_INVALID_VALUE) {
        throw ReplyCheck.inconsistent("the CUDA VMM allocation of segment " + Long.toUnsignedString(segmentId)
            + " cannot be mapped whole at segment_bytes " + segmentBytes + " (cuMemMap: CUDA_ERROR_INVALID_VALUE: "
            + "the allocation is smaller, or segment_bytes is not a multiple of its granularity)");
      }
      String what = mapped.failedCall().equals("cuMemSetAccess")
          ? "cuMemSetAccess(" + (readOnly ? "read-only" : "read-write") + ")"
          : mapped.failedCall() + "(" + segmentBytes + ")";
      throw CudaContexts.failed(what, mapped.result());
    });
  }
}
