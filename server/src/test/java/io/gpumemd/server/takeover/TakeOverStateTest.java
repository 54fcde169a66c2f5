package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.DeviceInfo;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The holder's check of a successor's devices (issue 33 item 4): same GPUs, same order. */
class TakeOverStateTest {
  private static final String A = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
  private static final String B = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
  private static final String C = "GPU-cccccccc-0000-0000-0000-000000000000";
  private static final List<DeviceInfo> OWN = List.of(
      new DeviceInfo(0, "gpu", A, "cuda", 1 << 30, 1 << 30), new DeviceInfo(1, "gpu", B, "cuda", 1 << 30, 1 << 30));

  @Test
  void sameGpusSameOrder_fits_whateverTheCase() {
    assertNull(TakeOverState.deviceMismatch(OWN, List.of(A, B.toUpperCase())));
  }

  @Test
  void sameGpusOtherOrder_isRefused_namingBothUuidsAndOrdinals() {
    String why = TakeOverState.deviceMismatch(OWN, List.of(B, A));
    assertEquals("device 0 is " + A + " here and " + B + " in the successor (which sees " + A + " as its device 1): "
        + "a successor must see the same GPUs in the same order (start it with this daemon's CUDA_VISIBLE_DEVICES), "
        + "else one GPU's memory would be served as another's", why);
  }

  @Test
  void anotherGpu_isRefused_sayingTheSuccessorDoesNotSeeIt() {
    String why = TakeOverState.deviceMismatch(OWN, List.of(A, C));
    assertTrue(why.startsWith("device 1 is " + B + " here and " + C + " in the successor (which does not see " + B
        + " at all)"), why);
  }

  @Test
  void noUuids_isRefused() {
    String why = TakeOverState.deviceMismatch(OWN, List.of());
    assertTrue(why.contains("names 0 device UUID(s) for 2 device(s)"), why);
  }
}
