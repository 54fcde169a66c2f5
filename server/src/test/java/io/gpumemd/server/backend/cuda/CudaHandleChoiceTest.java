package io.gpumemd.server.backend.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.cuda.CudaHandleChoice.Decision;
import io.gpumemd.server.backend.cuda.CudaHandleChoice.DeviceSupport;
import org.junit.jupiter.api.Test;

/** {@code --cuda-handles}: which handles a device gets, and why, from what it reports; no GPU needed. */
class CudaHandleChoiceTest {
  private static final DeviceSupport H100 = new DeviceSupport(0, "NVIDIA H100 80GB HBM3", true, true);
  private static final DeviceSupport NO_VMM = new DeviceSupport(1, "Old GPU", false, false);
  private static final DeviceSupport NO_FD = new DeviceSupport(2, "VMM without fds", true, false);

  @Test
  void auto_onADeviceWithVmmAndFdHandles_andAnFdChannel_isVmm() {
    Decision d = CudaHandleChoice.decide("auto", H100, true);

    assertTrue(d.vmm());
    assertEquals("vmm", d.handles());
    assertEquals("--cuda-handles auto: the device supports VMM with POSIX file descriptor handles", d.reason());
  }

  @Test
  void auto_withoutVmm_isLegacy_andSaysWhichAttributeIsMissing() {
    Decision d = CudaHandleChoice.decide("auto", NO_VMM, true);

    assertFalse(d.vmm());
    assertEquals("legacy", d.handles());
    assertEquals("--cuda-handles auto: device 1 (Old GPU) does not report "
        + "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", d.reason());
  }

  @Test
  void auto_withoutPosixFdHandles_isLegacy() {
    Decision d = CudaHandleChoice.decide("auto", NO_FD, true);

    assertFalse(d.vmm());
    assertTrue(d.reason().endsWith("does not report CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"),
        d.reason());
  }

  @Test
  void auto_withoutAnFdChannel_isLegacy_evenOnAnH100() {
    Decision d = CudaHandleChoice.decide("auto", H100, false);

    assertFalse(d.vmm());
    assertTrue(d.reason().contains("no fd channel"), d.reason());
  }

  @Test
  void legacy_isLegacyWhateverTheDeviceSupports() {
    assertFalse(CudaHandleChoice.decide("legacy", H100, true).vmm());
    assertEquals("--cuda-handles legacy", CudaHandleChoice.decide("legacy", NO_VMM, false).reason());
  }

  @Test
  void vmm_whereSupported_isVmm() {
    Decision d = CudaHandleChoice.decide("vmm", H100, true);

    assertTrue(d.vmm());
    assertEquals("--cuda-handles vmm", d.reason());
  }

  @Test
  void vmm_onADeviceWithoutSupport_failsWithOneClearMessage() {
    VmmUnavailableException e = assertThrows(VmmUnavailableException.class,
        () -> CudaHandleChoice.decide("vmm", NO_FD, true));

    assertEquals("cuda-handles: vmm, but device 2 (VMM without fds) does not report "
        + "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (expected: a device with VMM and POSIX "
        + "file descriptor handles, and an fd channel). Use --cuda-handles legacy or auto.", e.getMessage());
  }

  @Test
  void vmm_withoutAnFdChannel_fails() {
    VmmUnavailableException e = assertThrows(VmmUnavailableException.class,
        () -> CudaHandleChoice.decide("vmm", H100, false));

    assertTrue(e.getMessage().contains("no fd channel"), e.getMessage());
  }

  @Test
  void anUnknownMode_isRefused() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> CudaHandleChoice.decide("ipc", H100, true));

    assertEquals("cuda-handles: 'ipc' (expected: auto, vmm or legacy)", e.getMessage());
  }
}
