package io.gpumemd.client;

import static io.gpumemd.client.CudaTesting.readResult;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.server.testing.DaemonProcess;
import java.nio.charset.StandardCharsets;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUresult;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Issue 35 item 1, CUDA VMM: a mapping keeps its reserved range from mapping to close; vacated
 * ({@code cuMemUnmap}, {@code cuMemRelease}) and refilled with a newly imported allocation at the
 * same address ({@code cuMemMap}, {@code cuMemSetAccess}), the same segment or another of its
 * size. On a GPU or on the stand-in driver ({@code cuda-standin/}), which implements VMM
 * strictly: a copy from a range with nothing mapped fails there, as a write through read-only
 * access does.
 */
class CudaVmmAddressTest {
  private static final long SIZE = 4L << 20;
  private static DaemonProcess daemon;
  private static GpuMemClient client;
  private static FdChannelClient channel;

  @BeforeAll
  static void start() {
    CudaTesting.assumeDriver();
    daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "vmm");
    client = GpuMemClient.connect(daemon.unixTarget());
    channel = new FdChannelClient(daemon.unixTarget(), 5000);
  }

  @AfterAll
  static void stop() {
    if (daemon != null) {
      channel.close();
      client.close();
      daemon.close();
    }
  }

  @Test
  void leasePointer_keepsItsAddress_throughVacateAndRefill() {
    try (Lease first = client.lease(0, SIZE); Lease second = client.lease(0, SIZE)) {
      assertNotEquals(first.segmentId(), second.segmentId(), "two large leases, two segments");
      int device = CudaLeases.localDevice(first);
      CudaVmm.VmmMapping mapping = (CudaVmm.VmmMapping) first.mapping();
      long address = first.devicePointer();
      write(device, address, "first");
      write(device, second.devicePointer(), "second");

      mapping.vacate();
      assertTrue(mapping.vacated());
      assertNotEquals(CUresult.CUDA_SUCCESS, readResult(device, address), "nothing mapped: the copy is refused");
      mapping.vacate(); // twice: nothing

      refill(mapping, first.segmentId());
      assertEquals(address, first.devicePointer());
      assertEquals("first", read(device, address, 5));

      mapping.vacate();
      refill(mapping, second.segmentId()); // another allocation of the same size, same address
      assertEquals("second", read(device, address, 6));
      assertThrows(IllegalStateException.class, () -> mapping.refill(-1, 0), "mapped: cuMemMap needs an empty range");

      mapping.vacate();
      refill(mapping, first.segmentId()); // as it was, for the lease's own close
      assertEquals("first", read(device, first.devicePointer(), 5));
    }
  }

  @Test
  void closeAfterVacate_freesTheRange_andReadOnlyStaysReadOnly() {
    try (Lease lease = client.lease(0, SIZE)) {
      int device = CudaLeases.localDevice(lease);
      CudaVmm.VmmMapping vacated = importMapping(device, lease.segmentId(), false);
      vacated.vacate();
      vacated.close(); // cuMemAddressFree alone: any failed call would throw here
      assertThrows(IllegalStateException.class, vacated::vacate);

      CudaVmm.VmmMapping readOnly = importMapping(device, lease.segmentId(), true);
      try {
        readOnly.vacate();
        refill(readOnly, lease.segmentId());
        long address = CudaHandles.address(readOnly.base);
        assertEquals(CUresult.CUDA_SUCCESS, readResult(device, address));
        byte[] bytes = "nope".getBytes(StandardCharsets.US_ASCII);
        int[] result = new int[1];
        CudaContexts.run(device, () -> result[0] = CudaContexts.result(
            () -> cuMemcpyHtoD(new CUdeviceptr().withByteOffset(address), Pointer.to(bytes), bytes.length), "HtoD"));
        assertNotEquals(CUresult.CUDA_SUCCESS, result[0], "a write through read-only access is refused");
      } finally {
        readOnly.close();
      }
    }
  }

  private static CudaVmm.VmmMapping importMapping(int device, long segmentId, boolean readOnly) {
    try (ReceivedDescriptor d = channel.fetch(client.sessionId(), segmentId, readOnly)) {
      return (CudaVmm.VmmMapping) CudaVmm.importSegment(device, d.number(), segmentId, SIZE, readOnly);
    }
  }

  private static void refill(CudaVmm.VmmMapping mapping, long segmentId) {
    try (ReceivedDescriptor d = channel.fetch(client.sessionId(), segmentId, mapping.readOnly)) {
      mapping.refill(d.number(), segmentId);
    }
  }

  private static void write(int device, long address, String text) {
    CudaTesting.write(device, address, text.getBytes(StandardCharsets.US_ASCII));
  }

  private static String read(int device, long address, int length) {
    return new String(CudaTesting.read(device, address, length), StandardCharsets.US_ASCII);
  }
}
