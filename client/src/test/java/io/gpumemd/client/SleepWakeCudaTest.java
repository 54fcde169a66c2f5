package io.gpumemd.client;

import static io.gpumemd.client.CudaTesting.read;
import static io.gpumemd.client.CudaTesting.readResult;
import static io.gpumemd.client.CudaTesting.write;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.DaemonProcess;
import java.util.List;
import jcuda.driver.CUresult;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Sleep and wake of CUDA VMM leases (issue 35 item 6, CUDA): the device pointers handed out
 * before the sleep hold the same bytes (level 1) or zeros (level 2) after the wake, and while
 * asleep nothing is mapped under them (a copy is refused). On a GPU or on the stand-in driver
 * ({@code cuda-standin/}), which implements VMM strictly; skipped without either.
 */
class SleepWakeCudaTest {
  private static final int SIZE = 4 << 20;
  private static DaemonProcess daemon;
  private static GpuMemClient client;

  @BeforeAll
  static void start() {
    CudaTesting.assumeDriver();
    daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "vmm");
    client = GpuMemClient.connect(daemon.unixTarget());
  }

  @AfterAll
  static void stop() {
    if (daemon != null) {
      client.close();
      daemon.close();
    }
  }

  @Test
  void level1_everyPointerHoldsItsBytes_afterTheWake() {
    try (Lease big = client.lease(0, SIZE); Lease small = client.lease(0, 4096)) {
      List<Lease> leases = List.of(big, small);
      List<Long> pointers = leases.stream().map(Lease::devicePointer).toList();
      int device = CudaLeases.localDevice(big);
      for (int i = 0; i < leases.size(); i++) {
        write(device, pointers.get(i), pattern(i));
      }

      client.sleep(1);
      assertTrue(big.isAsleep());
      assertNotEquals(CUresult.CUDA_SUCCESS, readResult(device, pointers.get(0)), "nothing mapped while asleep");
      client.wake();

      assertEquals(pointers, leases.stream().map(Lease::devicePointer).toList(), "the same device addresses");
      for (int i = 0; i < leases.size(); i++) {
        assertArrayEquals(pattern(i), read(device, pointers.get(i), 64), "lease " + i);
      }
    }
  }

  @Test
  void level2_everyPointerReadsZeros_afterTheWake() {
    try (Lease lease = client.lease(0, SIZE)) {
      long pointer = lease.devicePointer();
      int device = CudaLeases.localDevice(lease);
      write(device, pointer, pattern(3));

      client.sleep(2);
      client.wake();

      assertFalse(lease.isAsleep());
      assertEquals(pointer, lease.devicePointer());
      assertArrayEquals(new byte[64], read(device, pointer, 64));
    }
  }

  private static byte[] pattern(int seed) {
    byte[] bytes = new byte[64];
    for (int i = 0; i < bytes.length; i++) {
      bytes[i] = (byte) (seed * 31 + i + 1);
    }
    return bytes;
  }
}
