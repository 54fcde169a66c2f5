package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuEventCreate;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventQuery;
import static jcuda.driver.JCudaDriver.cuEventRecord;

import jcuda.driver.CUcontext;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUevent;
import jcuda.driver.CUevent_flags;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;

/**
 * CUDA helpers for leases of CUDA devices: the device pointer as a JCuda {@link CUdeviceptr},
 * the context it is valid in, and a release that waits for the GPU without the caller waiting:
 * an event recorded on the caller's stream after the last use, polled in this process, and the
 * release sent once it has completed ({@link PendingReleases}).
 *
 * <p>None of these change the calling thread's current context. The pointer is valid in the
 * primary context of the lease's device ({@link #context}), the one the CUDA runtime (and
 * PyTorch, CuPy) uses for that device: make it current yourself, {@code cuCtxSetCurrent} or
 * {@code cuCtxPushCurrent}/{@code cuCtxPopCurrent}, or {@code cudaSetDevice} in the runtime.
 *
 * <p>Only callers that use CUDA leases load this class (and JCuda). Thread-safe.
 */
public final class CudaLeases {
  private CudaLeases() {}

  /**
   * The lease's memory as a device pointer in this process (segment base + offset), valid in
   * {@link #context}.
   *
   * @throws IllegalStateException when the lease is closed, its session lost, or not on a CUDA
   *     device
   */
  public static CUdeviceptr pointer(Lease lease) {
    checkOpen(lease);
    return CudaMappings.pointer(mapping(lease), lease.offset());
  }

  /**
   * The primary context of the lease's device in this process (its device matched to the
   * daemon's by uuid), where {@link #pointer} is valid. Retained by the client for the
   * process's life; do not destroy it.
   */
  public static CUcontext context(Lease lease) {
    checkOpen(lease);
    return CudaContexts.context(mapping(lease).device);
  }

  /**
   * This process's ordinal of the lease's device: the daemon's {@link Lease#device()} matched by
   * uuid, which a container may number differently.
   */
  public static int localDevice(Lease lease) {
    checkOpen(lease);
    return mapping(lease).device;
  }

  /**
   * Closes the lease now and releases it once the work queued on {@code stream} so far has
   * completed: records an event on the stream (in the device's primary context, which the
   * stream must belong to), and returns; a client thread polls the event and sends the release
   * when it completes, then destroys the event. A lease of a lost session is only marked closed;
   * a closed lease is left as it is. When the client closes first, it waits a bounded time for
   * the event ({@link GpuMemClient#close()}).
   *
   * @throws GpuMemException when the event cannot be created or recorded (the lease stays open)
   */
  public static void closeAfter(Lease lease, CUstream stream) {
    if (lease.isClosed()) {
      return;
    }
    if (lease.isLost()) {
      lease.close(); // gone with its session: nothing to wait for, nothing to release
      return;
    }
    int device = mapping(lease).device;
    CUevent event = CudaContexts.in(device, () -> {
      CUevent created = new CUevent();
      // A plain event: it never leaves this process, and no timing is needed.
      CudaContexts.check(() -> cuEventCreate(created, CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      try {
        CudaContexts.check(() -> cuEventRecord(created, stream), "cuEventRecord");
      } catch (RuntimeException e) {
        CudaContexts.result(() -> cuEventDestroy(created), "cuEventDestroy");
        throw e;
      }
      return created;
    });
    EventCompletion done = new EventCompletion(device, event);
    if (!lease.closeWhen(done)) {
      done.destroy(); // closed by another thread meanwhile
    }
  }

  /** An event recorded after a lease's last use, queried and destroyed in its device's context. */
  static final class EventCompletion implements PendingReleases.Completion {
    private final int device;
    private final CUevent event;

    EventCompletion(int device, CUevent event) {
      this.device = device;
      this.event = event;
    }

    @Override
    public boolean isComplete() {
      int result = CudaContexts.in(device, () -> CudaContexts.result(() -> cuEventQuery(event), "cuEventQuery"));
      if (result == CUresult.CUDA_SUCCESS) {
        return true;
      }
      if (result == CUresult.CUDA_ERROR_NOT_READY) {
        return false;
      }
      throw CudaContexts.failed("cuEventQuery", result);
    }

    @Override
    public void destroy() {
      CudaContexts.run(device, () -> CudaContexts.check(() -> cuEventDestroy(event), "cuEventDestroy"));
    }
  }

  private static void checkOpen(Lease lease) {
    if (lease.isClosed()) {
      throw new IllegalStateException("lease " + lease.id() + " is closed");
    }
  }

  private static CudaMappings.CudaMapping mapping(Lease lease) {
    if (!(lease.mapping() instanceof CudaMappings.CudaMapping cuda)) { // mapping() checks the session
      throw new IllegalStateException("lease " + lease.id() + " is not on a CUDA device");
    }
    return cuda;
  }
}
