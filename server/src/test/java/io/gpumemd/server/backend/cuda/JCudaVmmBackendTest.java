package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuMemGetAddressRange;
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

import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.common.cuda.VmmDriver;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.nio.file.Files;
import java.nio.file.Path;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
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
    assertTrue(segment instanceof FdPassedSegment);
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
    FdPassedSegment exported = (FdPassedSegment) segment;

    try (SegmentFd first = exported.open(false); SegmentFd second = exported.open(true)) {
      assertNotNull(first);
      assertNotNull(second);
      assertNotEquals(first.number(), second.number(), "each reply gets a descriptor of its own");
      assertTrue(Files.exists(Path.of("/proc/self/fd/" + first.number())));
      assertTrue(second.readOnly(), "the grant carries read-only; the descriptor cannot");

      assertArrayEquals(bytes, readThroughImport(segment, first.number(), MiB, bytes.length, true));
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
      passing.add(((FdPassedSegment) original).open(false));
      fd = passing.received()[0];
    }

    SegmentMemory adopted = backend.adopt(0, fd, 2 * MiB);
    backend.relinquish(original);

    assertNull(((FdPassedSegment) original).open(false), "the original hands out nothing more");
    assertArrayEquals(bytes, read(adopted, 4096, bytes.length));
    // Handed out as the daemon's own are: a duplicate of the descriptor it came by (the driver
    // exports only what the process created), which a client imports.
    Path kept = Path.of("/proc/self/fd/" + fd);
    Path keptFile = Files.readSymbolicLink(kept);
    try (SegmentFd handedOut = ((FdPassedSegment) adopted).open(false)) {
      assertNotEquals(fd, handedOut.number());
      assertArrayEquals(bytes, readThroughImport(adopted, handedOut.number(), 4096, bytes.length, true));
    }
    backend.zero(adopted, 0, 2 * MiB); // mapped read-write in the daemon's context, as its own
    assertArrayEquals(new byte[bytes.length], read(adopted, 4096, bytes.length));
    backend.free(adopted);
    assertNull(((FdPassedSegment) adopted).open(false), "a freed adopted segment hands out nothing more");
    assertTrue(!Files.exists(kept, java.nio.file.LinkOption.NOFOLLOW_LINKS)
        || !Files.readSymbolicLink(kept).equals(keptFile), "the descriptor it came by is closed with it");
  }

  @Test
  void adopt_ofASizeOffTheGranularity_isRefused() throws Exception {
    SegmentMemory original = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    int fd;
    try (io.gpumemd.server.pool.DescriptorPassing passing =
        new io.gpumemd.server.pool.DescriptorPassing(Files.createTempDirectory("vmm-takeover").resolve("s"))) {
      passing.add(((FdPassedSegment) original).open(false));
      fd = passing.received()[0];
    }

    assertThrows(BackendException.class, () -> backend.adopt(0, fd, 2 * MiB + 512));
  }

  @Test
  void open_afterFree_isNull_butAnImportOutlivesTheFree() throws Exception {
    SegmentMemory segment = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
    byte[] bytes = {1, 2, 3, 4, 5, 6, 7, 8};
    write(segment, 0, bytes);
    FdPassedSegment exported = (FdPassedSegment) segment;
    try (SegmentFd descriptor = exported.open(false)) {
      backend.free(segment);

      assertNull(exported.open(false), "nothing is exported from a released allocation");
      // The descriptor holds the allocation: a client that got it still maps the same bytes.
      assertArrayEquals(bytes, readThroughImport(segment, descriptor.number(), 0, bytes.length, false));
    }
  }

  /**
   * Imports a descriptor as a client does (import, reserve, map, set access read-only), reads
   * through that second mapping and undoes it all; while the daemon's own mapping stands
   * ({@code stillMapped}) the import lies at another address (after a free the address may be
   * reused). Through {@link VmmDriver}, as the clients do:
   * JCuda 12.0.0's own {@code cuMemSetAccess} hands the driver the access flags as the location
   * type, and a real driver refuses it.
   */
  private static byte[] readThroughImport(SegmentMemory segment, int fd, long offset, int length,
      boolean stillMapped) {
    current(segment);
    long bytes = segment.bytes();
    long[] imported = new long[1];
    CudaCalls.check(VmmDriver.importDescriptor(fd, imported), "cuMemImportFromShareableHandle");
    long[] at = new long[1];
    try {
      CudaCalls.check(VmmDriver.reserve(bytes, at), "cuMemAddressReserve");
      CudaCalls.check(VmmDriver.map(at[0], bytes, imported[0]), "cuMemMap");
      CudaCalls.check(VmmDriver.setAccess(at[0], bytes, segment.device(), VmmDriver.PROT_READ), "cuMemSetAccess");
      byte[] out = new byte[length];
      CudaCalls.check(cuMemcpyDtoH(Pointer.to(out), new CUdeviceptr().withByteOffset(at[0] + offset), length),
          "cuMemcpyDtoH");
      if (stillMapped) {
        assertNotEquals(CudaHandles.address(((DeviceSegment) segment).pointer()), at[0], "a mapping of its own");
      }
      return out;
    } finally {
      if (at[0] != 0) {
        VmmDriver.unmap(at[0], bytes);
        VmmDriver.addressFree(at[0], bytes);
      }
      VmmDriver.release(imported[0]);
    }
  }
}
