package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuMemsetD8Async;
import static jcuda.driver.JCudaDriver.cuStreamCreate;

import jcuda.driver.CUstream;
import jcuda.driver.CUstream_flags;

/**
 * A client process for {@link CloseWaitsForGpuWorkTest}: leases a block on device 0, queues a
 * memset of {@code value} over it on a non-blocking stream, then either closes the lease after
 * that stream ({@code closeAfter}) or leaves it open ({@code open}), and closes the client with a
 * bound of {@code boundMs}. Run it with {@code CUDA_STANDIN_STREAM_DELAY_MS} longer than the
 * bound: the memset is still queued when the close gives up waiting. Prints {@code leased
 * <segment> <offset>}, then {@code closed <ms>} once close returned, then stays alive for {@code
 * lingerMs} (a process that goes on with other work) and prints {@code exit}.
 *
 * <p>Arguments: target, size, value (0..255), closeAfter|open, boundMs, lingerMs.
 */
public final class QueuedWorkCloseMain {
  private QueuedWorkCloseMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    long size = Long.parseLong(args[1]);
    byte value = (byte) Integer.parseInt(args[2]);
    boolean closeAfter = args[3].equals("closeAfter");
    long boundMs = Long.parseLong(args[4]);
    long lingerMs = Long.parseLong(args[5]);
    GpuMemClient client = GpuMemClient.builder(target).closeWaitMillis(boundMs).connect();
    Lease lease = client.lease(0, size);
    System.out.println("leased " + lease.segmentId() + " " + lease.offset());
    int device = CudaLeases.localDevice(lease);
    CUstream stream = new CUstream();
    CudaContexts.run(device, () -> {
      CudaContexts.check(() -> cuStreamCreate(stream, CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      CudaContexts.check(() -> cuMemsetD8Async(CudaLeases.pointer(lease), value, size, stream), "cuMemsetD8Async");
    });
    if (closeAfter) {
      CudaLeases.closeAfter(lease, stream);
    }
    long start = System.nanoTime();
    client.close();
    System.out.println("closed " + (System.nanoTime() - start) / 1_000_000);
    System.out.flush();
    Thread.sleep(lingerMs);
    System.out.println("exit");
  }
}
