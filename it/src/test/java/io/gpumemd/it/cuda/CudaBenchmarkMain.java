package io.gpumemd.it.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuIpcGetMemHandle;
import static jcuda.driver.JCudaDriver.cuIpcOpenMemHandle;
import static jcuda.driver.JCudaDriver.cuIpcCloseMemHandle;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;

import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUipcMemHandle;
import jcuda.driver.CUipcMem_flags;
import jcuda.driver.JCudaDriver;

/**
 * GPU benchmark (issue 5): per size (2 MiB, 64 MiB, 1 GiB), the p50 of
 * <ol>
 *   <li>a gpumemd lease hit + release (RPCs, mapping already cached in this process);
 *   <li>{@code cuMemAlloc} + {@code cuMemFree} in this process;
 *   <li>{@code cuMemAlloc} + {@code cuIpcGetMemHandle} here + {@code cuIpcOpenMemHandle} (and close)
 *       in a second process, i.e. what sharing fresh memory costs without the daemon.
 * </ol>
 * Run on a GPU machine against a daemon started with {@code --backend cuda}:
 * {@code java -cp <server test classpath> io.gpumemd.it.cuda.CudaBenchmarkMain unix:///tmp/gpumemd.sock}.
 * The second process is this class with {@code --opener}.
 */
public final class CudaBenchmarkMain {
  private static final long[] SIZES = {2L << 20, 64L << 20, 1L << 30};
  private static final int ROUNDS = 50;

  private CudaBenchmarkMain() {}

  public static void main(String[] args) throws Exception {
    JCudaDriver.setExceptionsEnabled(true);
    cuInit(0);
    CUdevice device = new CUdevice();
    cuDeviceGet(device, 0);
    CUcontext context = new CUcontext();
    cuDevicePrimaryCtxRetain(context, device);
    cuCtxSetCurrent(context);
    if (args[0].equals("--opener")) {
      opener();
      return;
    }
    List<String> command = io.gpumemd.server.testing.DaemonProcess.javaCommand(CudaBenchmarkMain.class.getName());
    command.add("--opener");
    Process opener = new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    PrintWriter toOpener = new PrintWriter(opener.getOutputStream(), true);
    BufferedReader fromOpener = new BufferedReader(new InputStreamReader(opener.getInputStream()));
    System.out.printf("%-8s %16s %18s %26s%n", "size", "lease hit (us)", "alloc+free (us)", "alloc+IPC open 2nd proc (us)");
    try (GpuMemClient client = GpuMemClient.connect(args[0])) {
      for (long size : SIZES) {
        client.lease(0, size).close(); // warm: segment allocated and mapped
        long[] hit = new long[ROUNDS];
        long[] alloc = new long[ROUNDS];
        long[] ipc = new long[ROUNDS];
        for (int i = 0; i < ROUNDS; i++) {
          long t0 = System.nanoTime();
          try (Lease lease = client.lease(0, size)) {
            lease.devicePointer();
          }
          hit[i] = System.nanoTime() - t0;

          t0 = System.nanoTime();
          CUdeviceptr p = new CUdeviceptr();
          cuMemAlloc(p, size);
          cuMemFree(p);
          alloc[i] = System.nanoTime() - t0;

          t0 = System.nanoTime();
          CUdeviceptr q = new CUdeviceptr();
          cuMemAlloc(q, size);
          CUipcMemHandle handle = new CUipcMemHandle();
          cuIpcGetMemHandle(handle, q);
          toOpener.println(HexFormat.of().formatHex(CudaHandles.bytes(handle)));
          fromOpener.readLine(); // opened and closed there
          ipc[i] = System.nanoTime() - t0;
          cuMemFree(q);
        }
        System.out.printf("%-8s %16.1f %18.1f %26.1f%n", size >= 1L << 30 ? (size >> 30) + "GiB" : (size >> 20) + "MiB",
            p50(hit), p50(alloc), p50(ipc));
      }
    } finally {
      toOpener.close();
      opener.waitFor();
    }
  }

  private static void opener() throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    String line;
    while ((line = in.readLine()) != null) {
      CUipcMemHandle handle = CudaHandles.memHandle(HexFormat.of().parseHex(line));
      CUdeviceptr p = new CUdeviceptr();
      cuIpcOpenMemHandle(p, handle, CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      cuIpcCloseMemHandle(p);
      System.out.println("ok");
      System.out.flush();
    }
  }

  private static double p50(long[] nanos) {
    long[] sorted = nanos.clone();
    Arrays.sort(sorted);
    return sorted[sorted.length / 2] / 1000.0;
  }
}
