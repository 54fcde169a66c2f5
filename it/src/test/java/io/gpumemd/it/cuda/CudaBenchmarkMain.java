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
 * GPU benchmark: per size (2 MiB, 64 MiB, 1 GiB), after a warm-up of every path (segments
 * allocated, IPC handles opened, JIT compiled: {@value #WARMUP} rounds or
 * {@value #WARMUP_MILLIS} ms, whichever ends first), the p50 and p99 of
 * <ol>
 *   <li>a lease + close served from this client's own cache tier (no round trip);
 *   <li>a lease + close served by the daemon over the session stream (client cache off);
 *   <li>a lease + release over the unary calls (two round trips);
 *   <li>{@code cuMemAlloc} + {@code cuMemFree} in this process;
 *   <li>{@code cuMemAlloc} + {@code cuIpcGetMemHandle} here + {@code cuIpcOpenMemHandle} (and close)
 *       in a second process, i.e. what sharing fresh memory costs without the daemon.
 * </ol>
 * Daemon-served rounds that were pool misses (a new segment) are counted and left out of the
 * figures, so a cold lease is never reported as a hit. Run on a GPU machine against a daemon
 * started with {@code --backend cuda --client-cache-bytes 2GiB} (so that a 1 GiB block fits a
 * client's cache): {@code java -cp <it test classpath>
 * io.gpumemd.it.cuda.CudaBenchmarkMain unix:///tmp/gpumemd.sock}. The second process is this class
 * with {@code --opener}.
 */
public final class CudaBenchmarkMain {
  private static final long[] SIZES = {2L << 20, 64L << 20, 1L << 30};
  /**
   * A warm-up of 20 rounds left the JIT cold: on an H200 the first size's daemon-served lease
   * measured 1.4 ms, on the stand-in driver 1.2 ms, against 0.23 ms after 3,000 rounds.
   */
  private static final int WARMUP = 3000;
  private static final long WARMUP_MILLIS = 1500;
  private static final int ROUNDS = 200;

  private CudaBenchmarkMain() {}

  /** One measured path: lease + close, returning whether the daemon's pool had the block. */
  private interface Round {
    boolean run() throws Exception;
  }

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
    System.out.printf("%-6s %-34s %10s %10s %8s%n", "size", "path", "p50 (us)", "p99 (us)", "misses");
    try (GpuMemClient local = GpuMemClient.builder(args[0]).clientName("bench-local").clientCacheBytes(4L << 30).connect();
         GpuMemClient stream = GpuMemClient.builder(args[0]).clientName("bench-stream").clientCacheBytes(0).connect();
         GpuMemClient unary = GpuMemClient.builder(args[0]).clientName("bench-unary").unaryCalls(true).connect()) {
      for (long size : SIZES) {
        String label = size >= 1L << 30 ? (size >> 30) + "GiB" : (size >> 20) + "MiB";
        measure(label, "local hit (client cache)", () -> leaseAndClose(local, size));
        measure(label, "daemon-served, stream", () -> leaseAndClose(stream, size));
        measure(label, "daemon-served, unary", () -> leaseAndClose(unary, size));
        measure(label, "cuMemAlloc+cuMemFree", () -> {
          CUdeviceptr p = new CUdeviceptr();
          cuMemAlloc(p, size);
          cuMemFree(p);
          return true;
        });
        measure(label, "cuMemAlloc+IPC open in 2nd process", () -> {
          CUdeviceptr q = new CUdeviceptr();
          cuMemAlloc(q, size);
          CUipcMemHandle handle = new CUipcMemHandle();
          cuIpcGetMemHandle(handle, q);
          toOpener.println(HexFormat.of().formatHex(CudaHandles.bytes(handle)));
          fromOpener.readLine(); // opened and closed there
          cuMemFree(q);
          return true;
        });
      }
    } finally {
      toOpener.close();
      opener.waitFor();
    }
  }

  private static boolean leaseAndClose(GpuMemClient client, long size) {
    try (Lease lease = client.lease(0, size)) {
      lease.devicePointer();
      return lease.poolHit();
    }
  }

  private static void measure(String size, String path, Round round) throws Exception {
    long warmUntil = System.nanoTime() + WARMUP_MILLIS * 1_000_000;
    for (int i = 0; i < WARMUP && System.nanoTime() < warmUntil; i++) {
      round.run();
    }
    long[] nanos = new long[ROUNDS];
    int kept = 0;
    int misses = 0;
    for (int i = 0; i < ROUNDS; i++) {
      long t0 = System.nanoTime();
      boolean hit = round.run();
      long t = System.nanoTime() - t0;
      if (hit) {
        nanos[kept++] = t;
      } else {
        misses++;
      }
    }
    long[] sorted = Arrays.copyOf(nanos, kept);
    Arrays.sort(sorted);
    System.out.printf("%-6s %-34s %10.1f %10.1f %8d%n", size, path, percentile(sorted, 0.50), percentile(sorted, 0.99),
        misses);
  }

  private static double percentile(long[] sorted, double q) {
    return sorted.length == 0 ? Double.NaN : sorted[(int) Math.min(sorted.length - 1, Math.floor(q * sorted.length))] / 1000.0;
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
}
