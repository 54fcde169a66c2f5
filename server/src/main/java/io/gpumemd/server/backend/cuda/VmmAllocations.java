package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuMemAddressFree;
import static jcuda.driver.JCudaDriver.cuMemAddressReserve;
import static jcuda.driver.JCudaDriver.cuMemCreate;
import static jcuda.driver.JCudaDriver.cuMemGetAllocationGranularity;
import static jcuda.driver.JCudaDriver.cuMemMap;
import static jcuda.driver.JCudaDriver.cuMemRelease;
import static jcuda.driver.JCudaDriver.cuMemSetAccess;
import static jcuda.driver.JCudaDriver.cuMemUnmap;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.IpcHandle;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUmemAccessDesc;
import jcuda.driver.CUmemAccess_flags;
import jcuda.driver.CUmemAllocationGranularity_flags;
import jcuda.driver.CUmemAllocationHandleType;
import jcuda.driver.CUmemAllocationProp;
import jcuda.driver.CUmemAllocationType;
import jcuda.driver.CUmemGenericAllocationHandle;
import jcuda.driver.CUmemLocation;
import jcuda.driver.CUmemLocationType;

/**
 * The VMM segments of one device ({@code --cuda-handles vmm}), after {@code
 * shared/gpu/vmm_reference.py}: {@code cuMemCreate} (pinned, on the device, exportable as a
 * POSIX file descriptor) of a multiple of the device's minimum allocation granularity, mapped in
 * the daemon's own context ({@code cuMemAddressReserve}, {@code cuMemMap}, {@code
 * cuMemSetAccess} read-write) so that it can be zeroed; released in the reverse order.
 *
 * <p>Thread-safe: the allocation properties are built once and only read; the caller makes the
 * device's context current before each call.
 */
final class VmmAllocations {
  private final int device;
  private final CUcontext context;
  private final CUmemAllocationProp prop;
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
    this.prop = properties(device);
    long[] granule = new long[1];
    CudaCalls.check(cuMemGetAllocationGranularity(granule, prop,
        CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity on device " + device);
    if (granule[0] <= 0) {
      throw new BackendException("cuMemGetAllocationGranularity on device " + device + ": " + granule[0]
          + " (expected: > 0)");
    }
    this.granularity = granule[0];
    this.handle = new IpcHandle.CudaVmm(fdSocket);
  }

  private static CUmemAllocationProp properties(int device) {
    CUmemAllocationProp prop = new CUmemAllocationProp();
    prop.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = location(device);
    return prop;
  }

  private static CUmemLocation location(int device) {
    CUmemLocation location = new CUmemLocation();
    location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = device;
    return location;
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
    CUmemGenericAllocationHandle allocation = new CUmemGenericAllocationHandle();
    CudaCalls.check(cuMemCreate(allocation, bytes, prop, 0), "cuMemCreate(" + bytes + ") on device " + device);
    CUdeviceptr pointer = new CUdeviceptr();
    int step = 0;
    try {
      CudaCalls.check(cuMemAddressReserve(pointer, bytes, 0, new CUdeviceptr(), 0),
          "cuMemAddressReserve(" + bytes + ") on device " + device);
      step = 1;
      CudaCalls.check(cuMemMap(pointer, bytes, 0, allocation, 0), "cuMemMap on device " + device);
      step = 2;
      CUmemAccessDesc access = new CUmemAccessDesc();
      access.location = location(device);
      access.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CudaCalls.check(cuMemSetAccess(pointer, bytes, new CUmemAccessDesc[] {access}, 1),
          "cuMemSetAccess on device " + device);
      return new VmmSegment(device, bytes, context, allocation, pointer, handle);
    } catch (RuntimeException e) {
      if (step >= 2) {
        cuMemUnmap(pointer, bytes);
      }
      if (step >= 1) {
        cuMemAddressFree(pointer, bytes);
      }
      cuMemRelease(allocation);
      throw e;
    }
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
    int unmap = cuMemUnmap(segment.pointer(), bytes);
    int free = cuMemAddressFree(segment.pointer(), bytes);
    int release = cuMemRelease(segment.allocation());
    CudaCalls.check(unmap, "cuMemUnmap on device " + device);
    CudaCalls.check(free, "cuMemAddressFree on device " + device);
    CudaCalls.check(release, "cuMemRelease on device " + device);
    return true;
  }
}
