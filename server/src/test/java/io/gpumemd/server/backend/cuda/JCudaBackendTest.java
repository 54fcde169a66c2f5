package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRelease;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuMemGetAddressRange;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.MemoryBackendContractTest;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import java.util.List;
import java.util.regex.Pattern;
import jcuda.Pointer;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUresult;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The {@link MemoryBackendContractTest} on a real GPU, reading and writing device memory with
 * {@code cuMemcpyDtoH}/{@code cuMemcpyHtoD} in device 0's primary context. Skipped, with the
 * reason, where no CUDA device is usable (no driver, no GPU): {@link #probeCuda()} calls
 * {@link JCudaBackend#probe()} once, and every test is then reported as skipped with the reason.
 *
 * <p>The test retains device 0's primary context for the whole class, so that memory the
 * backend failed to free would still be there to find after the backend released its own
 * reference: {@link #assertReleased} asks the driver about each freed address.
 */
class JCudaBackendTest extends MemoryBackendContractTest {
  static CUdevice device;
  static CUcontext context;

  /** Why CUDA cannot be used here, or null when it can. */
  static String unusable;

  @BeforeAll
  static void probeCuda() {
    int count;
    try {
      count = JCudaBackend.probe();
    } catch (Throwable e) { // LinkageError when libcuda.so.1 is missing, BackendException otherwise
      unusable = "CUDA is not usable here (" + e + ")";
      return;
    }
    if (count == 0) {
      unusable = "the CUDA driver loaded but reports no devices";
      return;
    }
    device = new CUdevice();
    CudaCalls.check(cuDeviceGet(device, 0), "cuDeviceGet(0)");
    context = new CUcontext();
    CudaCalls.check(cuDevicePrimaryCtxRetain(context, device), "cuDevicePrimaryCtxRetain(0)");
  }

  @AfterAll
  static void releaseContext() {
    if (context != null) {
      cuDevicePrimaryCtxRelease(device);
      context = null;
    }
  }

  @Override
  protected MemoryBackend createBackend() {
    // Checked per test (the contract's @BeforeEach calls this) so that every test is reported
    // as skipped with the reason, rather than the class vanishing from the counts.
    assumeTrue(unusable == null, () -> getClass().getSimpleName() + " skipped: " + unusable);
    return openCuda();
  }

  /** The backend under test: legacy handles here ({@link JCudaVmmBackendTest}: VMM). */
  JCudaBackend openCuda() {
    return JCudaBackend.open();
  }

  /** Device 0's primary context on the calling thread (the backend's calls may have changed it). */
  static void current(SegmentMemory segment) {
    assertEquals(0, segment.device(), "the test reads device 0 only");
    CudaCalls.check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  }

  static CUdeviceptr at(SegmentMemory segment, long offset) {
    return ((DeviceSegment) segment).pointer().withByteOffset(offset);
  }

  @Override
  protected byte[] read(SegmentMemory segment, long offset, int length) {
    current(segment);
    byte[] bytes = new byte[length];
    CudaCalls.check(cuMemcpyDtoH(Pointer.to(bytes), at(segment, offset), length), "cuMemcpyDtoH");
    return bytes;
  }

  @Override
  protected void write(SegmentMemory segment, long offset, byte[] bytes) {
    current(segment);
    CudaCalls.check(cuMemcpyHtoD(at(segment, offset), Pointer.to(bytes), bytes.length), "cuMemcpyHtoD");
  }

  @Override
  protected void assertReleased(List<SegmentMemory> segments) {
    for (SegmentMemory segment : segments) {
      if (segment.device() != 0) {
        continue; // only device 0's context is held by the test
      }
      current(segment);
      CUdeviceptr base = new CUdeviceptr();
      long[] size = new long[1];
      int result = cuMemGetAddressRange(base, size, ((DeviceSegment) segment).pointer());
      assertNotEquals(CUresult.CUDA_SUCCESS, result,
          "the driver still knows a freed segment's address (" + size[0] + " bytes)");
    }
  }

  // ---------------------------------------------------------------------------- cuda only

  @Test
  void allocate_keepsTheDeviceAllocationAndItsIpcHandle() {
    SegmentMemory segment = allocate(0, 2 * MiB);

    current(segment);
    CUdeviceptr base = new CUdeviceptr();
    long[] size = new long[1];
    CudaCalls.check(cuMemGetAddressRange(base, size, ((CudaSegment) segment).pointer()), "cuMemGetAddressRange");
    assertEquals(2 * MiB, size[0]);
    byte[] handle = ((IpcHandle.CudaIpc) segment.handle()).bytes();
    assertEquals(64, handle.length);
    assertFalse(java.util.Arrays.equals(new byte[64], handle), "an all-zero IPC handle");
  }

  @Test
  void devices_reportLegacyHandles_andNoDescriptors() {
    assertEquals("legacy", backend.devices().get(0).cudaHandles());
    assertFalse(backend.passesDescriptors());
    assertEquals(1, backend.segmentGranularity(0), "cuMemAlloc takes any size");
    SegmentMemory segment = allocate(0, 2 * MiB + 512);
    assertTrue(segment.handle() instanceof IpcHandle.CudaIpc, segment.handle().toString());
    // Legacy IPC memory dies with its process: no take-over.
    assertTrue(backend.takeOverRefusal().contains("--cuda-handles vmm"), backend.takeOverRefusal());
  }

  @Test
  void devices_reportAGpuUuidAndItsMemory() {
    var info = backend.devices().get(0);
    assertTrue(Pattern.matches("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", info.uuid()), info.uuid());
    assertTrue(info.freeBytesAtStart() > 0 && info.freeBytesAtStart() <= info.capacityBytes(), info.toString());
    assertEquals("cuda", backend.name());
  }

  @Test
  void freshSegments_areNotPromisedToBeZero() {
    assertFalse(backend.freshSegmentsAreZeroed(), "cuMemAlloc memory is uninitialized");
  }
}
