package io.gpumemd.client;

import io.gpumemd.common.cuda.CudaHandles;
import static jcuda.driver.JCudaDriver.cuEventCreate;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventRecord;
import static jcuda.driver.JCudaDriver.cuIpcGetEventHandle;

import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUevent;
import jcuda.driver.CUevent_flags;
import jcuda.driver.CUipcEventHandle;
import jcuda.driver.CUstream;

/**
 * CUDA helpers for leases of CUDA devices: the device pointer as a JCuda {@link CUdeviceptr},
 * and a release that waits for the GPU: the daemon reuses the block only once an event recorded
 * after the last use on the caller's stream has completed (README, "How the pool works"; the
 * daemon's {@code PendingEvents}).
 *
 * <p>Only callers that use CUDA leases load this class (and JCuda). Thread-safe.
 */
public final class CudaLeases {
  private CudaLeases() {}

  /**
   * The lease's memory as a device pointer in this process (segment base + offset). Also makes
   * the device's primary context current on the calling thread, where the pointer is valid.
   */
  public static CUdeviceptr pointer(Lease lease) {
    CudaMappings.CudaMapping mapping = mapping(lease);
    CudaMappings.makeCurrent(mapping.device);
    return CudaMappings.pointer(mapping, lease.offset());
  }

  /**
   * Records an interprocess event on {@code stream} after the work queued so far and releases
   * the lease with it; the call returns without waiting for the GPU. A lease of a lost session
   * (the daemon restarted) is only marked closed.
   */
  public static void closeAfter(Lease lease, CUstream stream) {
    if (lease.isLost()) {
      lease.close(); // gone with its session: nothing to wait for, nothing to release
      return;
    }
    CudaMappings.CudaMapping mapping = mapping(lease);
    CudaMappings.makeCurrent(mapping.device);
    CUevent event = new CUevent();
    CudaMappings.check(cuEventCreate(event, CUevent_flags.CU_EVENT_INTERPROCESS | CUevent_flags.CU_EVENT_DISABLE_TIMING),
        "cuEventCreate");
    try {
      CudaMappings.check(cuEventRecord(event, stream), "cuEventRecord");
      CUipcEventHandle handle = new CUipcEventHandle();
      CudaMappings.check(cuIpcGetEventHandle(handle, event), "cuIpcGetEventHandle");
      lease.closeWithEvent(CudaHandles.bytes(handle));
    } finally {
      // The daemon has opened its own reference by the time Release returns.
      cuEventDestroy(event);
    }
  }

  private static CudaMappings.CudaMapping mapping(Lease lease) {
    if (!(lease.mapping() instanceof CudaMappings.CudaMapping cuda)) {
      throw new IllegalStateException("lease " + lease.id() + " is not on a CUDA device");
    }
    return cuda;
  }
}
