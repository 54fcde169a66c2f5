package io.gpumemd.it.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemsetD8;
import static jcuda.driver.JCudaDriver.cuMemsetD8Async;
import static jcuda.driver.JCudaDriver.cuStreamCreate;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Share;
import io.gpumemd.client.ShareOptions;
import jcuda.Pointer;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;

/**
 * Client processes for {@link CudaVmmTest}, each printing one {@code RESULT key=value ...} line.
 *
 * <ul>
 *   <li>{@code produce TARGET SIZE VALUE READONLY}: leases a block, fills it with {@code VALUE}
 *       (waiting for the fill), shares it (read-only holds when {@code READONLY}, any number of
 *       attaches) and exits, the token holding the block: {@code token segment offset}.
 *   <li>{@code consume TARGET TOKEN SIZE WRITE}: attaches, copies the block to the host ({@code
 *       first last uniform readOnly}); with {@code WRITE}, then tries to write 0xEE through the
 *       hold and reports the driver's answer ({@code write=<CUresult name>}).
 *   <li>{@code fillAfter TARGET SIZE VALUE}: leases, fills on its own stream, and releases with
 *       {@link CudaLeases#closeAfter}; the client closes at once, with the release pending.
 *   <li>{@code read TARGET SIZE}: leases the same size and reads it back ({@code hit first last
 *       uniform segment offset}).
 * </ul>
 */
public final class CudaVmmProcessMain {
  private CudaVmmProcessMain() {}

  public static void main(String[] args) {
    String mode = args[0];
    try (GpuMemClient client = GpuMemClient.builder(args[1]).clientName("cuda-vmm-" + mode).clientCacheBytes(0)
        .connect()) {
      switch (mode) {
        case "produce" -> produce(client, Long.parseLong(args[2]), (byte) Integer.parseInt(args[3]),
            Boolean.parseBoolean(args[4]));
        case "consume" -> consume(client, args[2], Long.parseLong(args[3]), Boolean.parseBoolean(args[4]));
        case "fillAfter" -> fillAfter(client, Long.parseLong(args[2]), (byte) Integer.parseInt(args[3]));
        case "read" -> read(client, Long.parseLong(args[2]));
        default -> throw new IllegalArgumentException("mode: " + mode);
      }
    }
  }

  private static void produce(GpuMemClient client, long size, byte value, boolean readOnly) {
    Lease lease = client.lease(0, size);
    check(cuCtxSetCurrent(CudaLeases.context(lease)), "cuCtxSetCurrent");
    check(cuMemsetD8(CudaLeases.pointer(lease), value, size), "cuMemsetD8");
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    Share share = lease.share(ShareOptions.DEFAULT.withReadOnly(readOnly));
    System.out.println("RESULT token=" + share.token() + " segment=" + lease.segmentId() + " offset=" + lease.offset());
    lease.close(); // the token holds the block
  }

  private static void consume(GpuMemClient client, String token, long size, boolean write) {
    try (Lease hold = client.attach(token, "cuda-vmm-consumer")) {
      check(cuCtxSetCurrent(CudaLeases.context(hold)), "cuCtxSetCurrent");
      StringBuilder out = new StringBuilder("RESULT readOnly=" + hold.readOnly() + " segment=" + hold.segmentId());
      appendBytes(out, hold, size);
      if (write) {
        int result = cuMemsetD8(CudaLeases.pointer(hold), (byte) 0xEE, size);
        if (result == CUresult.CUDA_SUCCESS) {
          result = cuCtxSynchronize(); // a fault shows here, if not at the call
        }
        out.append(" write=").append(CUresult.stringFor(result));
      }
      System.out.println(out);
      System.out.flush();
      if (write) {
        // A faulted context cannot unmap cleanly; the process ends, and the daemon takes the hold back.
        Runtime.getRuntime().halt(0);
      }
    }
  }

  private static void fillAfter(GpuMemClient client, long size, byte value) {
    Lease lease = client.lease(0, size);
    check(cuCtxSetCurrent(CudaLeases.context(lease)), "cuCtxSetCurrent");
    CUstream stream = new CUstream();
    check(cuStreamCreate(stream, 0), "cuStreamCreate");
    for (int i = 0; i < 64; i++) { // a queue of work, so that the event is likely still pending
      check(cuMemsetD8Async(CudaLeases.pointer(lease), (byte) (i == 63 ? value : i), size, stream), "cuMemsetD8Async");
    }
    CudaLeases.closeAfter(lease, stream);
    System.out.println("RESULT segment=" + lease.segmentId() + " offset=" + lease.offset() + " closed=" + lease.isClosed());
  }

  private static void read(GpuMemClient client, long size) {
    try (Lease lease = client.lease(0, size)) {
      check(cuCtxSetCurrent(CudaLeases.context(lease)), "cuCtxSetCurrent");
      StringBuilder out = new StringBuilder("RESULT hit=" + lease.poolHit() + " segment=" + lease.segmentId()
          + " offset=" + lease.offset());
      appendBytes(out, lease, size);
      System.out.println(out);
    }
  }

  private static void appendBytes(StringBuilder out, Lease lease, long size) {
    byte[] host = new byte[(int) size];
    check(cuMemcpyDtoH(Pointer.to(host), CudaLeases.pointer(lease), size), "cuMemcpyDtoH");
    boolean uniform = true;
    for (byte b : host) {
      uniform &= b == host[0];
    }
    out.append(" first=").append(host[0] & 0xff).append(" last=").append(host[host.length - 1] & 0xff)
        .append(" uniform=").append(uniform);
  }

  private static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new IllegalStateException(call + ": " + CUresult.stringFor(result));
    }
  }
}
