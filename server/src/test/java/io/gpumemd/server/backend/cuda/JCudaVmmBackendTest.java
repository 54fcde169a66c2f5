package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuMemAddressFree;
import static jcuda.driver.JCudaDriver.cuMemAddressReserve;
import static jcuda.driver.JCudaDriver.cuMemGetAddressRange;
import static jcuda.driver.JCudaDriver.cuMemImportFromShareableHandle;
import static jcuda.driver.JCudaDriver.cuMemMap;
import static jcuda.driver.JCudaDriver.cuMemRelease;
import static jcuda.driver.JCudaDriver.cuMemSetAccess;
import static jcuda.driver.JCudaDriver.cuMemUnmap;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.DescriptorSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentDescriptor;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.nio.file.Files;
import java.nio.file.Path;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUmemAccessDesc;
import jcuda.driver.CUmemAccess_flags;
import jcuda.driver.CUmemAllocationHandleType;
import jcuda.driver.CUmemGenericAllocationHandle;
import jcuda.driver.CUmemLocation;
import jcuda.driver.CUmemLocationType;
import org.junit.jupiter.api.Test;

/**
 * The backend contract with VMM handles ({@code --cuda-handles vmm}), plus what is particular to
 * them: sizes a multiple of the device's granularity, and descriptors that import, in this very
 * process as a client would in its own ({@code shared/gpu/vmm_reference.py}), to the bytes the
 * daemon's mapping holds. Skipped, with the reason, without a GPU or where device 0 lacks VMM
 * with POSIX file descriptor handles.
 */
class JCudaVmmBackendTest extends JCudaBackendTest {
  private static final String FD_SOCKET = "/run/gpumemd/gpumemd.sock.fd";

  @Override
  JCudaBackend openCuda() {
    try {
      return JCudaBackend.open("vmm", FD_SOCKET);
    } catch (VmmUnavailableException e) {
      assumeTrue(false, "JCudaVmmBackendTest skipped: " + e.getMessage());
      throw e;
    }
  }

  /** A VMM handle names only the fd channel: the allocation itself tells segments apart. */
  @Override
  protected String mappedBy(SegmentMemory segment) {
    return Long.toString(((VmmSegment) segment).allocation());
  }

  private long granularity() {
    return backend.segmentGranularity(0);
  }

  private static long roundUp(long bytes, long granule) {
    return (bytes + granule - 1) / granule * granule;
  }

  /** The contract's size, made a multiple of the granularity as the pool makes every segment. */
  @Override
  @Test
  protected void allocate_largerThanTheDevice_isOutOfMemory() {
    long capacity = backend.devices().get(0).capacityBytes();

    assertThrows(BackendOutOfMemoryException.class,
        () -> backend.allocate(0, roundUp(capacity + 2 * MiB, granularity()), SegmentOwner.DAEMON));

    assertNotNull(allocate(0, granularity()));
  }

  @Override
  @Test
  void allocate_keepsTheDeviceAllocationAndItsIpcHandle() {
    SegmentMemory segment = allocate(0, 2 * MiB);

    current(segment);
    CUdeviceptr base = new CUdeviceptr();
    long[] size = new long[1];
    CudaCalls.check(cuMemGetAddressRange(base, size, ((DeviceSegment) segment).pointer()), "cuMemGetAddressRange");
    assertEquals(2 * MiB, size[0], "the daemon maps the whole allocation");
    assertEquals(new IpcHandle.CudaVmm(FD_SOCKET), segment.handle());
    assertTrue(segment instanceof DescriptorSegment);
  }

  /** Not a test here: the VMM devices' report is {@link #devices_reportVmmHandles_andTheirGranularity}. */
  @Override
  void devices_reportLegacyHandles_andNoDescriptors() {}

  @Test
  void devices_reportVmmHandles_andTheirGranularity() {
    assertEquals("vmm", backend.devices().get(0).cudaHandles());
    assertTrue(backend.passesDescriptors(), "the daemon must serve the fd channel");
    long granule = granularity();
    assertTrue(granule >= 4096 && (granule & (granule - 1)) == 0, "granularity " + granule);
  }

  @Test
  void allocate_ofASizeOffTheGranularity_isRefused_andAWholeGranuleIsNot() {
    long granule = granularity();

    BackendException e = assertThrows(BackendException.class,
        () -> backend.allocate(0, granule + 512, SegmentOwner.DAEMON));
    assertTrue(e.getMessage().contains("multiple of the allocation granularity " + granule), e.getMessage());

    assertEquals(granule, allocate(0, granule).bytes());
  }

  @Test
  void open_exportsAFreshDescriptorEachTime_thatImportsToTheSameBytes() throws Exception {
    SegmentMemory segment = allocate(0, 2 * MiB);
    byte[] bytes = new byte[4096];
    for (int i = 0; i < bytes.length; i++) {
      bytes[i] = (byte) (i * 7 + 3);
    }
    write(segment, MiB, bytes);
    DescriptorSegment exported = (DescriptorSegment) segment;

    try (SegmentDescriptor first = exported.open(false); SegmentDescriptor second = exported.open(true)) {
      assertNotNull(first);
      assertNotNull(second);
      assertNotEquals(first.number(), second.number(), "each reply gets a descriptor of its own");
      assertTrue(Files.exists(Path.of("/proc/self/fd/" + first.number())));
      assertTrue(second.readOnly(), "the grant carries read-only; the descriptor cannot");

      assertArrayEquals(bytes, readThroughImport(segment, first.number(), MiB, bytes.length));
      first.close();
      assertDoesNotThrow(first::close, "closed once, however often asked");
    }
  }

  /**
   * The take-over on one process: a descriptor exported and passed over a Unix socket is adopted
   * (imported and mapped by the backend), the original relinquished, and the adopted segment
   * still holds the bytes: relinquishing never destroys what another handle holds.
   */
  @Test
  void adopt_ofAPassedDescriptor_holdsTheBytes_afterTheOriginalIsRelinquished() throws Exception {
    assertNull(backend.takeOverRefusal());
    SegmentMemory original = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    byte[] bytes = {9, 8, 7, 6, 5, 4, 3, 2};
    write(original, 4096, bytes);
    int fd;
    try (io.gpumemd.server.pool.DescriptorPassing passing =
        new io.gpumemd.server.pool.DescriptorPassing(Files.createTempDirectory("vmm-takeover").resolve("s"))) {
      passing.add(((DescriptorSegment) original).open(false));
      fd = passing.received()[0];
    }

    SegmentMemory adopted = backend.adopt(0, fd, 2 * MiB);
    backend.relinquish(original);

    assertNull(((DescriptorSegment) original).open(false), "the original hands out nothing more");
    assertArrayEquals(bytes, read(adopted, 4096, bytes.length));
    backend.zero(adopted, 0, 2 * MiB); // mapped read-write in the daemon's context, as its own
    assertArrayEquals(new byte[bytes.length], read(adopted, 4096, bytes.length));
    backend.free(adopted);
  }

  @Test
  void adopt_ofASizeOffTheGranularity_isRefused() throws Exception {
    SegmentMemory original = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    int fd;
    try (io.gpumemd.server.pool.DescriptorPassing passing =
        new io.gpumemd.server.pool.DescriptorPassing(Files.createTempDirectory("vmm-takeover").resolve("s"))) {
      passing.add(((DescriptorSegment) original).open(false));
      fd = passing.received()[0];
    }

    assertThrows(BackendException.class, () -> backend.adopt(0, fd, 2 * MiB + 512));
  }

  @Test
  void open_afterFree_isNull_butAnImportOutlivesTheFree() throws Exception {
    SegmentMemory segment = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    byte[] bytes = {1, 2, 3, 4, 5, 6, 7, 8};
    write(segment, 0, bytes);
    DescriptorSegment exported = (DescriptorSegment) segment;
    try (SegmentDescriptor descriptor = exported.open(false)) {
      backend.free(segment);

      assertNull(exported.open(false), "nothing is exported from a released allocation");
      // The descriptor holds the allocation: a client that got it still maps the same bytes.
      assertArrayEquals(bytes, readThroughImport(segment, descriptor.number(), 0, bytes.length));
    }
  }

  /**
   * Imports a descriptor as a client does (import, reserve, map, set access read-only), reads
   * through that second mapping and undoes it all.
   */
  private static byte[] readThroughImport(SegmentMemory segment, int fd, long offset, int length) {
    current(segment);
    long bytes = segment.bytes();
    CUmemGenericAllocationHandle imported = new CUmemGenericAllocationHandle();
    // The POSIX fd is passed as the pointer's value, (void*)(uintptr_t) fd, as in the reference.
    CudaCalls.check(cuMemImportFromShareableHandle(imported, new Pointer().withByteOffset(fd),
        CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "cuMemImportFromShareableHandle");
    CUdeviceptr at = new CUdeviceptr();
    try {
      CudaCalls.check(cuMemAddressReserve(at, bytes, 0, new CUdeviceptr(), 0), "cuMemAddressReserve");
      CudaCalls.check(cuMemMap(at, bytes, 0, imported, 0), "cuMemMap");
      CUmemAccessDesc access = new CUmemAccessDesc();
      access.location = new CUmemLocation();
      access.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = segment.device();
      access.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ;
      CudaCalls.check(cuMemSetAccess(at, bytes, new CUmemAccessDesc[] {access}, 1), "cuMemSetAccess");
      byte[] out = new byte[length];
      CudaCalls.check(cuMemcpyDtoH(Pointer.to(out), at.withByteOffset(offset), length), "cuMemcpyDtoH");
      assertNotEquals(((DeviceSegment) segment).pointer(), at, "a mapping of its own");
      return out;
    } finally {
      cuMemUnmap(at, bytes);
      cuMemAddressFree(at, bytes);
      cuMemRelease(imported);
    }
  }
}
