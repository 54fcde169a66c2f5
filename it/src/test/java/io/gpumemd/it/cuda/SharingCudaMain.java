package io.gpumemd.it.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemsetD8;

import io.gpumemd.client.CudaLeases;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Share;
import io.gpumemd.client.ShareOptions;
import jcuda.Pointer;
import jcuda.driver.CUresult;

/**
 * A CUDA client process for {@link SharingCudaTest}. {@code produce TARGET SIZE VALUE}: leases
 * a block on device 0, fills it with {@code VALUE} on the GPU (waiting for the fill), shares it
 * one-shot and exits, leaving the token to hold the block; prints {@code RESULT token=...
 * segment=... offset=... block=...}. {@code consume TARGET TOKEN SIZE}: attaches with the token, copies
 * the block to the host and prints {@code RESULT segment=... offset=... attached=... first=...
 * last=... uniform=...}, then releases its hold.
 */
public final class SharingCudaMain {
  private SharingCudaMain() {}

  public static void main(String[] args) {
    String mode = args[0];
    try (GpuMemClient client = GpuMemClient.builder(args[1]).clientName("cuda-share-" + mode).connect()) {
      if (mode.equals("produce")) {
        long size = Long.parseLong(args[2]);
        Lease lease = client.lease(0, size);
        check(cuCtxSetCurrent(CudaLeases.context(lease)), "cuCtxSetCurrent"); // the client leaves it to us
        check(cuMemsetD8(CudaLeases.pointer(lease), (byte) Integer.parseInt(args[3]), size), "cuMemsetD8");
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        Share share = lease.share(ShareOptions.oneShot());
        System.out.println("RESULT token=" + share.token() + " segment=" + lease.segmentId() + " offset="
            + lease.offset() + " block=" + lease.blockBytes());
        lease.close(); // the token holds the block; the share is deliberately left open
      } else {
        long size = Long.parseLong(args[3]);
        try (Lease hold = client.attach(args[2], "cuda-consumer")) {
          byte[] host = new byte[(int) size];
          check(cuCtxSetCurrent(CudaLeases.context(hold)), "cuCtxSetCurrent");
          check(cuMemcpyDtoH(Pointer.to(host), CudaLeases.pointer(hold), size), "cuMemcpyDtoH");
          boolean uniform = true;
          for (byte b : host) {
            uniform &= b == host[0];
          }
          System.out.println("RESULT segment=" + hold.segmentId() + " offset=" + hold.offset() + " attached="
              + hold.attached() + " first=" + (host[0] & 0xff) + " last=" + (host[host.length - 1] & 0xff)
              + " uniform=" + uniform);
        }
      }
    }
  }

  private static void check(int result, String call) {
    if (result != CUresult.CUDA_SUCCESS) {
      throw new IllegalStateException(call + ": " + CUresult.stringFor(result));
    }
  }
}
