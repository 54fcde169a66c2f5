package io.gpumemd.server.backend.cuda;

import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import jcuda.driver.CUdeviceptr;

/** One {@code cuMemAlloc} with its IPC handle, taken once at allocation. Immutable. */
record CudaSegment(int device, long bytes, CUdeviceptr pointer, IpcHandle.CudaIpc handle) implements SegmentMemory {}
