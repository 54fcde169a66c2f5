package io.gpumemd.common.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import jcuda.Pointer;
import org.junit.jupiter.api.Test;

/** What CudaHandles hands JCuda, checked without a driver (JCuda's Java classes load without one). */
class CudaHandlesTest {
  @Test
  void osHandle_carriesTheDescriptorNumberAsThePointerValue() {
    assertEquals(37, CudaHandles.value(CudaHandles.osHandle(37)));
    assertEquals(0, CudaHandles.value(CudaHandles.osHandle(0)));
  }

  @Test
  void aPointerToAnIntArray_wouldHandTheDriverZero_notTheDescriptor() {
    // Why osHandle exists: JCuda passes address + offset, and an array's Pointer has neither.
    assertEquals(0, CudaHandles.value(Pointer.to(new int[] {37})));
  }

  @Test
  void osHandle_negative_isRefused() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> CudaHandles.osHandle(-1));
    assertEquals("descriptor: -1 (expected: >= 0)", e.getMessage());
  }

  @Test
  void ipcHandleBytes_roundTrip() {
    byte[] bytes = new byte[64];
    bytes[0] = 1;
    bytes[63] = 99;
    assertEquals(99, CudaHandles.bytes(CudaHandles.memHandle(bytes))[63]);
  }
}
