package io.gpumemd.it.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemGetInfo;

import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.JCudaDriver;

/**
 * Another process on the node that takes device memory behind gpumemd's back: allocates all of
 * device 0's free memory but {@code args[0]} bytes with {@code cuMemAlloc}, prints {@code held
 * BYTES}, and keeps it until its stdin closes (the driver frees it when the process exits).
 */
public final class DeviceMemoryHogMain {
  private DeviceMemoryHogMain() {}

  public static void main(String[] args) throws Exception {
    long leave = Long.parseLong(args[0]);
    JCudaDriver.setExceptionsEnabled(true);
    cuInit(0);
    CUdevice device = new CUdevice();
    cuDeviceGet(device, 0);
    CUcontext context = new CUcontext();
    cuDevicePrimaryCtxRetain(context, device);
    cuCtxSetCurrent(context);
    long[] free = new long[1];
    long[] total = new long[1];
    cuMemGetInfo(free, total);
    long take = free[0] - leave;
    cuMemAlloc(new CUdeviceptr(), take);
    System.out.println("held " + take);
    System.out.flush();
    while (System.in.read() >= 0) {
      // holds until the test closes this process's stdin
    }
  }
}
