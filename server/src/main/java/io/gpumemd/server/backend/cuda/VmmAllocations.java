package io.gpumemd.server.backend.cuda;

import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.common.cuda.VmmDriver;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.IpcHandle;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdeviceptr;

/**
 * The VMM segments of one device ({@code --cuda-handles vmm}), after {@code
 * shared/gpu/vmm_reference.py}: {@code cuMemCreate} (pinned, on the device, exportable as a
 * POSIX file descriptor) of a multiple of the device's minimum allocation granularity, mapped in
 * the daemon's own context ({@code cuMemAddressReserve}, {@code cuMemMap}, {@code
 * cuMemSetAccess} read-write) so that it can be zeroed; released in the reverse order.
 *
 * <p>The calls go through {@link VmmDriver} (JNA), not JCuda, whose 12.0.0 bindings of {@code
 * cuMemCreate}'s properties, {@code cuMemSetAccess} and {@code cuMemExportToShareableHandle}
 * hand the driver garbled arguments (see there).
 *
 * <p>Thread-safe: immutable after construction; the caller makes the device's context current
 * before each call.
 */
final class VmmAllocations {
  private final int device;
  private final CUcontext context;
  private final long granularity;
  private final IpcHandle.CudaVmm handle;

  /**
   * Reads the device's granularity; the device's context must be current.
   *
   * @param fdSocket the fd channel that hands the segments out
   */
  VmmAllocations(int device, CUcontext context, String fdSocket) {
    this.device = device;
    this.context = context;
    long[] granule = new long[1];
    CudaCalls.check(VmmDriver.minimumGranularity(device, granule), "cuMemGetAllocationGranularity on device " + device);
    if (granule[0] <= 0) {
      throw new BackendException("cuMemGetAllocationGranularity on device " + device + ": " + granule[0]
          + " (expected: > 0)");
    }
    this.granularity = granule[0];
    this.handle = new IpcHandle.CudaVmm(fdSocket);
  }

  /** Every segment's size is a multiple of this (2 MiB on an H100). */
  long granularity() {
    return granularity;
  }

  /**
   * Creates and maps one allocation; on any failure what was done is undone before the
   * exception propagates.
   *
   * @param bytes a multiple of {@link #granularity}
   */
  VmmSegment allocate(long bytes) {
    if (bytes % granularity != 0) {
      throw new BackendException("cuMemCreate on device " + device + ": " + bytes + " bytes (expected: a multiple "
          + "of the allocation granularity " + granularity + ")");
    }
    long[] out = new long[1];
    CudaCalls.check(VmmDriver.create(device, bytes, out), "cuMemCreate(" + bytes + ") on device " + device);
    return mapOwn(out[0], bytes, "", -1);
  }

  /**
   * Adopts an allocation a predecessor daemon exported ({@code --take-over}): imports the
   * descriptor ({@code cuMemImportFromShareableHandle}), then reserves, maps and opens it
   * read-write in the daemon's context as {@link #allocate} does its own, so that it can be
   * zeroed. The segment takes the descriptor over and hands out duplicates of it (see {@link
   * VmmSegment}: the driver does not export an imported handle). On any failure what was done
   * is undone before the exception propagates, and the descriptor stays the caller's.
   *
   * @param bytes the allocation's size as the predecessor's state says, a multiple of {@link
   *     #granularity}; a mapping larger than the allocation fails in {@code cuMemMap}
   */
  VmmSegment adopt(int fd, long bytes) {
    if (bytes <= 0 || bytes % granularity != 0) {
      throw new BackendException("cuMemImportFromShareableHandle on device " + device + ": " + bytes
          + " bytes (expected: a positive multiple of the allocation granularity " + granularity + ")");
    }
    long[] out = new long[1];
    CudaCalls.check(VmmDriver.importDescriptor(fd, out), "cuMemImportFromShareableHandle(fd " + fd + ") on device "
        + device);
    return mapOwn(out[0], bytes, " of an adopted allocation", fd);
  }

  /**
   * Maps a whole allocation read-write for the daemon's own device ({@link VmmDriver#mapWhole});
   * on a failure it releases the allocation and throws naming the call. {@code adoptedFrom}: the
   * descriptor the segment takes over on success, or -1.
   */
  private VmmSegment mapOwn(long allocation, long bytes, String what, int adoptedFrom) {
    VmmDriver.Mapped mapped = VmmDriver.mapWhole(allocation, bytes, new int[] {device}, VmmDriver.PROT_READWRITE);
    if (!mapped.ok()) {
      VmmDriver.release(allocation);
      CudaCalls.check(mapped.result(), mapped.failedCall() + "(" + bytes + " bytes)" + what + " on device " + device);
    }
    // JCuda's calls (cuMemsetD8) take the address as a CUdeviceptr: a null one offset by it.
    CUdeviceptr pointer = new CUdeviceptr().withByteOffset(mapped.address());
    return new VmmSegment(device, bytes, context, allocation, pointer, handle, adoptedFrom);
  }

  /**
   * Unmaps the daemon's mapping, frees its address range and releases its handle. Descriptors
   * already exported and importers' mappings keep the memory until they are gone too.
   *
   * @return false when it was already released
   * @throws BackendException naming the first call that failed (the later ones still run)
   */
  boolean release(VmmSegment segment) {
    if (!segment.markReleased()) {
      return false;
    }
    long bytes = segment.bytes();
    long address = CudaHandles.address(segment.pointer());
    int unmap = VmmDriver.unmap(address, bytes);
    int free = VmmDriver.addressFree(address, bytes);
    int release = VmmDriver.release(segment.allocation());
    CudaCalls.check(unmap, "cuMemUnmap on device " + device);
    CudaCalls.check(free, "cuMemAddressFree on device " + device);
    CudaCalls.check(release, "cuMemRelease on device " + device);
    return true;
  }
}
