package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuIpcCloseMemHandle;
import static jcuda.driver.JCudaDriver.cuIpcOpenMemHandle;
import static jcuda.driver.JCudaDriver.cuMemsetD8;

import io.gpumemd.common.cuda.CudaHandles;
import io.grpc.Status;
import java.util.HashMap;
import java.util.Map;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUipcMemHandle;
import jcuda.driver.CUipcMem_flags;
import jcuda.driver.CUresult;
import jcuda.driver.JCudaDriver;

/**
 * The CUDA side of the client: opens segment handles with {@code cuIpcOpenMemHandle} in the
 * device's primary context. This class is the only one (with {@link CudaLeases}) that touches
 * JCuda, and it is loaded only when a lease carries a CUDA handle, so a host-only client never
 * needs the CUDA natives.
 *
 * <p>Thread-safe: contexts are retained once per device under the class lock; each call makes
 * the device's context current on the calling thread.
 */
final class CudaMappings {
  private static final Map<Integer, CUcontext> CONTEXTS = new HashMap<>();

  private CudaMappings() {}

  /** A segment opened in this process; {@link #base} is its device address here. */
  static final class CudaMapping implements SegmentMapping {
    final int device;
    final CUdeviceptr base;
    private boolean closed;

    CudaMapping(int device, CUdeviceptr base) {
      this.device = device;
      this.base = base;
    }

    @Override
    public synchronized void close() {
      if (!closed) {
        closed = true;
        makeCurrent(device);
        check(cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle");
      }
    }
  }

  static SegmentMapping open(int device, byte[] handleBytes) {
    makeCurrent(device);
    CUipcMemHandle handle = CudaHandles.memHandle(handleBytes);
    CUdeviceptr base = new CUdeviceptr();
    check(cuIpcOpenMemHandle(base, handle, CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
        "cuIpcOpenMemHandle on device " + device);
    return new CudaMapping(device, base);
  }

  /** The device address of a mapping's base in this process. */
  /** Writes zeros over {@code bytes} bytes at {@code offset} of a mapped segment (synchronous). */
  static void zero(SegmentMapping mapping, long offset, long bytes) {
    CudaMapping cuda = (CudaMapping) mapping;
    makeCurrent(cuda.device);
    check(cuMemsetD8(pointer(mapping, offset), (byte) 0, bytes), "cuMemsetD8");
    check(cuCtxSynchronize(), "cuCtxSynchronize");
  }

  /** A device pointer {@code offset} bytes into a mapped segment: the one place of that sum. */
  static CUdeviceptr pointer(SegmentMapping mapping, long offset) {
    return ((CudaMapping) mapping).base.withByteOffset(offset);
  }

  /** Makes the primary context of a device current on this thread, retaining it once. */
  static synchronized void makeCurrent(int device) {
    CUcontext context = CONTEXTS.get(device);
    if (context == null) {
      JCudaDriver.setExceptionsEnabled(false);
      check(cuInit(0), "cuInit");
      CUdevice dev = new CUdevice();
      check(cuDeviceGet(dev, device), "cuDeviceGet(" + device + ")");
      context = new CUcontext();
      check(cuDevicePrimaryCtxRetain(context, dev), "cuDevicePrimaryCtxRetain(" + device + ")");
      CONTEXTS.put(device, context);
    }
    check(cuCtxSetCurrent(context), "cuCtxSetCurrent(" + device + ")");
  }

  static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new GpuMemException(Status.Code.INTERNAL, call + " failed: " + CUresult.stringFor(result), null);
    }
  }
}
