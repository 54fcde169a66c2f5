package io.gpumemd.it.cuda;

import static jcuda.driver.JCudaDriver.cuCtxCreate;
import static jcuda.driver.JCudaDriver.cuCtxDestroy;
import static jcuda.driver.JCudaDriver.cuCtxGetCurrent;
import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceInfo;
import io.gpumemd.proto.v1.ListDevicesRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import io.gpumemd.server.testing.TestChannel;
import java.util.Map;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The Java client's CUDA path on a real GPU (issue 24): VMM segments by descriptor across
 * processes, a read-only hold the driver enforces, the release sent after an event recorded in
 * the client's own process, and the caller's current context left as it was. Skipped, with the
 * reason, where no GPU is usable, and the VMM tests where the daemon serves no VMM handles.
 */
class CudaVmmTest {
  private static final long SIZE = 2L << 20;

  @BeforeEach
  void needsGpu() {
    CudaAvailability.assumeUsable();
  }

  /** A daemon serving device 0 with VMM handles; the test is skipped where it cannot. */
  private static DaemonProcess vmmDaemon() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--cuda-handles", "vmm", "--device-limit-bytes",
        "1GiB");
    if (!daemon.process().isAlive()) {
      String output = daemon.output();
      daemon.close();
      Assumptions.assumeFalse(output.contains("cuda-handles"),
          "CUDA VMM tests skipped: this daemon has no --cuda-handles vmm (" + output.lines().findFirst().orElse("") + ")");
      throw new AssertionError("daemon did not start:\n" + output);
    }
    try (TestChannel channel = new TestChannel(daemon.unixTarget())) {
      DeviceInfo device = AdminGrpc.newBlockingStub(channel.channel()).listDevices(ListDevicesRequest.getDefaultInstance())
          .getDevices(0);
      assertEquals("vmm", device.getCudaHandles(), "--cuda-handles vmm was asked for:\n" + daemon.output());
    }
    return daemon;
  }

  private static Map<String, String> run(String... args) throws Exception {
    return ResultProcess.run(CudaVmmProcessMain.class, args);
  }

  @Test
  void vmmBytes_writtenByOneProcess_areReadByAnother_throughTheDescriptor() throws Exception {
    try (DaemonProcess daemon = vmmDaemon()) {
      Map<String, String> produced = run("produce", daemon.unixTarget(), Long.toString(SIZE), "171", "false");
      Map<String, String> consumed = run("consume", daemon.unixTarget(), produced.get("token"), Long.toString(SIZE),
          "false");
      assertEquals(produced.get("segment"), consumed.get("segment"));
      assertEquals("171", consumed.get("first"), consumed.get("output"));
      assertEquals("171", consumed.get("last"));
      assertEquals("true", consumed.get("uniform"));
    }
  }

  @Test
  void writeThroughAReadOnlyHold_isRefusedByTheDriver_andTheBytesStay() throws Exception {
    try (DaemonProcess daemon = vmmDaemon()) {
      Map<String, String> produced = run("produce", daemon.unixTarget(), Long.toString(SIZE), "7", "true");
      Map<String, String> writer = run("consume", daemon.unixTarget(), produced.get("token"), Long.toString(SIZE),
          "true");
      assertEquals("true", writer.get("readOnly"));
      assertEquals("7", writer.get("first"), writer.get("output"));
      assertNotEquals("CUDA_SUCCESS", writer.get("write"), "a write through a read-only VMM mapping: " + writer.get("output"));
      Map<String, String> reader = run("consume", daemon.unixTarget(), produced.get("token"), Long.toString(SIZE),
          "false");
      assertEquals("7", reader.get("first"), "the refused write changed nothing: " + reader.get("output"));
      assertEquals("true", reader.get("uniform"));
    }
  }

  @Test
  void releaseAfterARecordedEvent_handsTheNextHolderTheFinishedBytes() throws Exception {
    try (DaemonProcess daemon = vmmDaemon()) {
      long size = 64L << 20;
      Map<String, String> filled = run("fillAfter", daemon.unixTarget(), Long.toString(size), "90");
      assertEquals("true", filled.get("closed"), "closed for the caller at once");
      Map<String, String> read = run("read", daemon.unixTarget(), Long.toString(size));
      assertEquals("true", read.get("hit"), read.get("output"));
      assertEquals(filled.get("segment"), read.get("segment"));
      assertEquals(filled.get("offset"), read.get("offset"));
      assertEquals("90", read.get("first"), "the last fill, queued before the event");
      assertEquals("90", read.get("last"));
      assertEquals("true", read.get("uniform"));
    }
  }

  /** Any handle kind: the daemon's default for the device. */
  @Test
  void leaseMapZeroPointerAndRelease_leaveTheCallersCurrentContextAsItWas() throws Exception {
    try (DaemonProcess daemon = DaemonProcess.start("--backend", "cuda", "--device-limit-bytes", "1GiB");
         GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).connect()) {
      check(cuInit(0), "cuInit");
      CUdevice device = new CUdevice();
      check(cuDeviceGet(device, 0), "cuDeviceGet");
      CUcontext own = new CUcontext(); // not the primary context the client uses
      check(cuCtxCreate(own, 0, device), "cuCtxCreate");
      try {
        Lease lease = client.lease(0, SIZE, true, "ctx");
        assertEquals(own, current(), "after a lease that mapped a segment and zeroed");
        CudaLeases.pointer(lease);
        assertNotEquals(own, CudaLeases.context(lease));
        lease.close(); // into the client cache
        try (Lease zeroed = client.lease(0, SIZE, true, "local zero")) {
          assertTrue(zeroed.localHit());
          assertEquals(own, current(), "after a locally zeroed lease");
          CUcontext leaseContext = CudaLeases.context(zeroed);
          check(cuCtxSetCurrent(leaseContext), "cuCtxSetCurrent");
          CUstream stream = new CUstream();
          check(cuStreamCreate(stream, 0), "cuStreamCreate");
          check(cuCtxSetCurrent(own), "cuCtxSetCurrent");
          CudaLeases.closeAfter(zeroed, stream);
          assertEquals(own, current(), "after a stream-ordered release");
          long deadline = System.nanoTime() + 10_000_000_000L;
          while (client.pendingReleases() > 0 && System.nanoTime() < deadline) {
            Thread.sleep(1);
          }
          assertEquals(0, client.pendingReleases(), "the release went out once its event completed");
          // in the stream's own context: a stream belongs to the context it was created in
          check(cuCtxSetCurrent(leaseContext), "cuCtxSetCurrent");
          check(cuStreamDestroy(stream), "cuStreamDestroy");
          check(cuCtxSetCurrent(own), "cuCtxSetCurrent");
        }
      } finally {
        check(cuCtxDestroy(own), "cuCtxDestroy");
      }
    }
  }

  private static CUcontext current() {
    CUcontext context = new CUcontext();
    check(cuCtxGetCurrent(context), "cuCtxGetCurrent");
    return context;
  }

  private static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new IllegalStateException(call + ": " + CUresult.stringFor(result));
    }
  }
}
