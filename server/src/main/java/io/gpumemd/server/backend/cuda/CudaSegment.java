package io.gpumemd.server.backend.cuda;

import io.gpumemd.server.backend.IpcHandle;
import jcuda.driver.CUdeviceptr;

/** One {@code cuMemAlloc} with its IPC handle, taken once at allocation (legacy handles). Immutable. */
record CudaSegment(int device, long bytes, CUdeviceptr pointer, IpcHandle.CudaIpc handle) implements DeviceSegment {}
