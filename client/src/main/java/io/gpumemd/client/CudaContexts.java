package io.gpumemd.client;

import static jcuda.driver.JCudaDriver.cuCtxPopCurrent;
import static jcuda.driver.JCudaDriver.cuCtxPushCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceCanAccessPeer;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDeviceGetCount;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuInit;

import io.gpumemd.common.cuda.CudaUuids;
import io.gpumemd.common.cuda.DeviceUuidDriver;
import io.grpc.Status;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;
import jcuda.CudaException;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUresult;

/**
 * This process's CUDA devices as the client uses them: their uuids (to find the daemon's
 * device among them, {@link CudaUuids}), their primary contexts (retained once, never
 * released: the application's own runtime-API work shares them), and every driver call the
 * client makes, run with the device's primary context pushed on the calling thread and popped
 * after, so that the caller's current context is what it was (a PyTorch thread on device 0
 * stays on device 0 after a lease on device 1).
 *
 * <p>Driver calls are checked ({@link #check}) whether or not the application turned on
 * JCuda's exceptions ({@code JCudaDriver.setExceptionsEnabled}, a JVM-wide switch the client
 * leaves alone): a result code other than success, or a {@link CudaException} JCuda throws for
 * it, becomes a {@link GpuMemException} naming the call.
 *
 * <p>Thread-safe: the device list and the contexts are guarded by the class lock; the pushes
 * and pops are per thread.
 */
final class CudaContexts {
  private static final Map<Integer, CUcontext> CONTEXTS = new HashMap<>();
  private static final Map<Integer, int[]> ACCESSORS = new HashMap<>();
  private static List<String> visible;

  private CudaContexts() {}

  /** A driver call: returns a {@code CUresult}. */
  @FunctionalInterface
  interface Call {
    int run();
  }

  /** The uuids of the devices this process sees, by its ordinal; read once. */
  static synchronized List<String> visibleUuids() {
    if (visible == null) {
      check(() -> cuInit(0), "cuInit");
      int[] count = new int[1];
      check(() -> cuDeviceGetCount(count), "cuDeviceGetCount");
      List<String> uuids = new ArrayList<>(count[0]);
      for (int d = 0; d < count[0]; d++) {
        // _v2 through JNA, as the daemon reads it: JCuda's binds the first version, which names
        // a MIG instance by its parent GPU (DeviceUuidDriver).
        byte[] uuid = new byte[CudaUuids.UUID_BYTES];
        final int ordinal = d;
        check(() -> DeviceUuidDriver.uuid(ordinal, uuid), DeviceUuidDriver.symbol() + "(" + ordinal + ")");
        uuids.add(CudaUuids.format(uuid));
      }
      visible = List.copyOf(uuids);
    }
    return visible;
  }

  /**
   * This process's ordinal of the daemon's device.
   *
   * @param daemonUuids {@code OpenSessionResponse.devices}: ordinal to uuid
   * @throws GpuMemException FAILED_PRECONDITION naming the uuid when this process cannot see it
   */
  static int localDevice(int daemonDevice, Map<Integer, String> daemonUuids) {
    try {
      return CudaUuids.localOrdinal(daemonDevice, daemonUuids, visibleUuids());
    } catch (IllegalStateException e) {
      throw new GpuMemException(Status.Code.FAILED_PRECONDITION, e.getMessage(), null);
    }
  }

  /** The primary context of a device of this process (its ordinal), retained on first use. */
  static synchronized CUcontext context(int localDevice) {
    CUcontext context = CONTEXTS.get(localDevice);
    if (context == null) {
      check(() -> cuInit(0), "cuInit");
      CUdevice device = device(localDevice);
      CUcontext retained = new CUcontext();
      check(() -> cuDevicePrimaryCtxRetain(retained, device), "cuDevicePrimaryCtxRetain(" + localDevice + ")");
      CONTEXTS.put(localDevice, retained);
      context = retained;
    }
    return context;
  }

  /**
   * Runs {@code body} with the device's primary context pushed on this thread, and pops it
   * after, also when {@code body} fails: the caller's current context is left as it was.
   */
  static <T> T in(int localDevice, Supplier<T> body) {
    CUcontext context = context(localDevice);
    check(() -> cuCtxPushCurrent(context), "cuCtxPushCurrent(" + localDevice + ")");
    T result;
    try {
      result = body.get();
    } catch (RuntimeException | Error e) {
      try {
        pop(localDevice);
      } catch (RuntimeException popFailed) {
        e.addSuppressed(popFailed);
      }
      throw e;
    }
    pop(localDevice);
    return result;
  }

  /** As {@link #in(int, Supplier)} for a body without a result. */
  static void run(int localDevice, Runnable body) {
    in(localDevice, () -> {
      body.run();
      return null;
    });
  }

  private static void pop(int localDevice) {
    CUcontext popped = new CUcontext();
    check(() -> cuCtxPopCurrent(popped), "cuCtxPopCurrent(" + localDevice + ")");
  }

  /**
   * The devices of this process whose contexts can access memory on {@code localDevice}
   * directly ({@code cuDeviceCanAccessPeer}), {@code localDevice} first; read once per device.
   * A VMM mapping grants them access as a legacy handle opened with {@code
   * CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS} lets them in. A device the driver cannot answer for is
   * left out (it gets no access; the lease's own device still maps).
   */
  static synchronized int[] accessors(int localDevice) {
    return ACCESSORS.computeIfAbsent(localDevice, own -> {
      int count = visibleUuids().size();
      CUdevice owner = device(own);
      List<Integer> devices = new ArrayList<>(List.of(own));
      for (int d = 0; d < count; d++) {
        if (d == own) {
          continue;
        }
        int[] can = new int[1];
        final int peer = d;
        if (result(() -> cuDeviceCanAccessPeer(can, device(peer), owner), "cuDeviceCanAccessPeer") == CUresult.CUDA_SUCCESS
            && can[0] == 1) {
          devices.add(d);
        }
      }
      return devices.stream().mapToInt(Integer::intValue).toArray();
    }).clone();
  }

  private static CUdevice device(int ordinal) {
    CUdevice device = new CUdevice();
    check(() -> cuDeviceGet(device, ordinal), "cuDeviceGet(" + ordinal + ")");
    return device;
  }

  /**
   * Runs a driver call and fails unless it succeeded.
   *
   * @throws GpuMemException INTERNAL naming the call and CUDA's error
   */
  static void check(Call call, String what) {
    int result = result(call, what);
    if (result != CUresult.CUDA_SUCCESS) {
      throw failed(what, result);
    }
  }

  /**
   * Runs a driver call and returns its result code, also where JCuda's exceptions are on (it
   * then throws for any result but success; the code is recovered from its message).
   */
  static int result(Call call, String what) {
    try {
      return call.run();
    } catch (CudaException e) {
      int code = codeOf(e.getMessage());
      if (code == CUresult.CUDA_SUCCESS) {
        throw new GpuMemException(Status.Code.INTERNAL, what + " failed: " + e.getMessage(), e);
      }
      return code;
    }
  }

  static GpuMemException failed(String what, int result) {
    return new GpuMemException(Status.Code.INTERNAL, what + " failed: " + CUresult.stringFor(result), null);
  }

  /**
   * The result code a {@link CudaException} names: JCuda's message is {@code
   * CUresult.stringFor(code)}; 0 (success) where it names none.
   */
  static int codeOf(String message) {
    return message == null ? CUresult.CUDA_SUCCESS : CODES.getOrDefault(message, CUresult.CUDA_SUCCESS);
  }

  /** Every {@code CUresult} by its name, to read a {@link CudaException}'s code back. */
  private static final Map<String, Integer> CODES = codes();

  private static Map<String, Integer> codes() {
    Map<String, Integer> codes = new HashMap<>();
    for (java.lang.reflect.Field f : CUresult.class.getFields()) {
      if (f.getType() == int.class && java.lang.reflect.Modifier.isStatic(f.getModifiers())) {
        try {
          int code = f.getInt(null);
          codes.put(CUresult.stringFor(code), code);
        } catch (IllegalAccessException e) {
          throw new IllegalStateException("CUresult." + f.getName(), e);
        }
      }
    }
    return Map.copyOf(codes);
  }
}
