package io.gpumemd.common.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class CudaUuidsTest {
  private static final String A = "GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718";
  private static final String B = "GPU-00000000-0000-0000-0000-0000000000ff";

  @Test
  void format_isNvidiaSmiStyle_lowerCaseWithGroups() {
    byte[] uuid = {0x1f, 0x2e, 0x3d, 0x4c, 0x5b, 0x6a, 0x79, (byte) 0x80, (byte) 0xa1, (byte) 0xb2, (byte) 0xc3,
        (byte) 0xd4, (byte) 0xe5, (byte) 0xf6, 0x07, 0x18};
    assertEquals(A, CudaUuids.format(uuid));
  }

  @Test
  void format_wrongLength_isRefusedNamingIt() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> CudaUuids.format(new byte[15]));
    assertEquals("CUDA uuid: 15 bytes (expected: 16)", e.getMessage());
  }

  @Test
  void localOrdinal_daemonDevice3_isTheWorkersDevice0_byUuid() {
    Map<Integer, String> daemon = Map.of(0, "GPU-aaaa0000-0000-0000-0000-000000000000", 3, A);
    assertEquals(0, CudaUuids.localOrdinal(3, daemon, List.of(A)));
    assertEquals(1, CudaUuids.localOrdinal(3, daemon, List.of(B, A)));
  }

  @Test
  void localOrdinal_comparesWithoutCaseOrPrefix() {
    assertEquals(0, CudaUuids.localOrdinal(0, Map.of(0, A.toUpperCase()), List.of(A.substring(4))));
  }

  @Test
  void localOrdinal_invisibleDevice_namesTheUuidAndWhatIsVisible() {
    IllegalStateException e = assertThrows(IllegalStateException.class,
        () -> CudaUuids.localOrdinal(3, Map.of(3, A), List.of(B)));
    assertTrue(e.getMessage().startsWith("gpumemd device 3 (" + A + ") is not visible to this process (it sees ["
        + B + "])"), e.getMessage());
  }

  @Test
  void localOrdinal_noVisibleDevice_saysSo() {
    IllegalStateException e = assertThrows(IllegalStateException.class,
        () -> CudaUuids.localOrdinal(0, Map.of(0, A), List.of()));
    assertTrue(e.getMessage().contains("it sees no devices"), e.getMessage());
  }

  @Test
  void localOrdinal_deviceTheDaemonDidNotReport_isRefused() {
    IllegalStateException e = assertThrows(IllegalStateException.class,
        () -> CudaUuids.localOrdinal(2, Map.of(0, A), List.of(A)));
    assertTrue(e.getMessage().contains("gpumemd device 2 is not among the devices the daemon reported"), e.getMessage());
  }

  @Test
  void localOrdinal_olderDaemonWithoutUuids_usesTheOrdinal_withinWhatIsVisible() {
    assertEquals(1, CudaUuids.localOrdinal(1, Map.of(), List.of(A, B)));
    assertThrows(IllegalStateException.class, () -> CudaUuids.localOrdinal(2, Map.of(), List.of(A, B)));
  }
}
