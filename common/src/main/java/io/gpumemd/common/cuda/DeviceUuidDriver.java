package io.gpumemd.common.cuda;

import com.sun.jna.Function;
import com.sun.jna.Memory;
import com.sun.jna.NativeLibrary;

/**
 * A device's UUID as the CUDA driver's {@code cuDeviceGetUuid_v2} reads it, bound through JNA to
 * {@code libcuda.so.1}, so that the daemon and both clients (Python binds the same symbol) name
 * a device the same way.
 *
 * <p>Why not JCuda: its 12.0.0 natives import the unversioned {@code cuDeviceGetUuid}
 * ({@code nm -D libJCudaDriver-12.0.0-linux-x86_64.so}), the first version of the call, which
 * under MIG returns the parent GPU's UUID for every MIG instance; {@code _v2} returns the
 * instance's own (the UUID that {@code CUDA_VISIBLE_DEVICES} and {@code nvidia-smi -L} name
 * it by). Two MIG instances of one GPU would otherwise look like one device, and a client could
 * map the daemon's device to the wrong instance. Only a driver older than CUDA 11.4, which has
 * no {@code _v2} (and, on such drivers, no MIG UUIDs to tell apart), is asked the first version.
 *
 * <p>Stateless and thread-safe; the library is loaded on first use.
 */
public final class DeviceUuidDriver {
  private DeviceUuidDriver() {}

  /**
   * {@code cuDeviceGet} then {@code cuDeviceGetUuid_v2} (or the first version where the driver
   * has no {@code _v2}) of this process's device {@code ordinal}; {@code cuInit} must have run.
   *
   * @param uuid receives the 16 bytes
   * @return the driver's result code, of the first call that failed
   */
  public static int uuid(int ordinal, byte[] uuid) {
    if (uuid.length != CudaUuids.UUID_BYTES) {
      throw new IllegalArgumentException("uuid buffer: " + uuid.length + " bytes (expected: " + CudaUuids.UUID_BYTES
          + ")");
    }
    try (Memory device = new Memory(Integer.BYTES); Memory out = new Memory(CudaUuids.UUID_BYTES)) {
      device.setInt(0, -1);
      int result = Calls.DEVICE_GET.invokeInt(new Object[] {device, ordinal});
      if (result != 0) {
        return result;
      }
      out.clear();
      result = Calls.GET_UUID.invokeInt(new Object[] {out, device.getInt(0)});
      out.read(0, uuid, 0, uuid.length);
      return result;
    }
  }

  /** The name of the entry point used: {@code cuDeviceGetUuid_v2}, or the first version on an old driver. */
  public static String symbol() {
    return Calls.GET_UUID.getName();
  }

  private static final class Calls {
    private static final NativeLibrary CUDA = NativeLibrary.getInstance("libcuda.so.1");
    static final Function DEVICE_GET = CUDA.getFunction("cuDeviceGet");
    static final Function GET_UUID = uuidFunction();

    private static Function uuidFunction() {
      try {
        return CUDA.getFunction("cuDeviceGetUuid_v2");
      } catch (UnsatisfiedLinkError e) {
        // A driver before CUDA 11.4: the first version is all there is (and it has no MIG UUIDs).
        return CUDA.getFunction("cuDeviceGetUuid");
      }
    }
  }
}
