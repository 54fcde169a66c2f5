package io.gpumemd.common.cuda;

import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * GPU identities across processes. A daemon that sees every GPU of a node and a worker
 * container that sees only its own number the same GPU differently (the daemon's device 3 may
 * be the worker's device 0), so a lease's device, the daemon's ordinal, is matched to this
 * process's ordinal by UUID ({@code OpenSessionResponse.devices[].uuid}, compared with {@code
 * cuDeviceGetUuid} of each visible device). Pure functions, no JCuda: stateless and
 * thread-safe.
 */
public final class CudaUuids {
  /** Bytes of a {@code CUuuid}. */
  public static final int UUID_BYTES = 16;

  private CudaUuids() {}

  /**
   * {@code GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx} in lower case, as {@code nvidia-smi -L}
   * prints it and as the daemon reports it.
   */
  public static String format(byte[] uuid) {
    if (uuid.length != UUID_BYTES) {
      throw new IllegalArgumentException("CUDA uuid: " + uuid.length + " bytes (expected: " + UUID_BYTES + ")");
    }
    StringBuilder s = new StringBuilder(40).append("GPU-");
    for (int i = 0; i < UUID_BYTES; i++) {
      if (i == 4 || i == 6 || i == 8 || i == 10) {
        s.append('-');
      }
      s.append(Character.forDigit((uuid[i] >> 4) & 0xf, 16)).append(Character.forDigit(uuid[i] & 0xf, 16));
    }
    return s.toString();
  }

  /**
   * This process's ordinal of the daemon's device {@code daemonDevice}.
   *
   * @param daemonUuids the daemon's devices by ordinal, with their uuids; empty from a daemon
   *     that predates {@code OpenSessionResponse.devices}, where ordinals are taken as they are
   * @param visibleUuids the uuids of the devices this process sees, by ordinal
   * @throws IllegalStateException naming the uuid when this process cannot see the device, or
   *     the daemon did not report it
   */
  public static int localOrdinal(int daemonDevice, Map<Integer, String> daemonUuids, List<String> visibleUuids) {
    if (daemonUuids.isEmpty()) {
      if (daemonDevice >= visibleUuids.size()) {
        throw new IllegalStateException("gpumemd device " + daemonDevice + " is not visible to this process ("
            + visibleUuids.size() + " visible devices), and the daemon reported no device uuids to match by");
      }
      return daemonDevice;
    }
    String uuid = daemonUuids.get(daemonDevice);
    if (uuid == null) {
      throw new IllegalStateException("gpumemd device " + daemonDevice + " is not among the devices the daemon "
          + "reported at OpenSession (" + daemonUuids.keySet() + ")");
    }
    for (int i = 0; i < visibleUuids.size(); i++) {
      if (same(uuid, visibleUuids.get(i))) {
        return i;
      }
    }
    throw new IllegalStateException("gpumemd device " + daemonDevice + " (" + uuid + ") is not visible to this "
        + "process (it sees " + (visibleUuids.isEmpty() ? "no devices" : visibleUuids) + "): give the process that "
        + "GPU (CUDA_VISIBLE_DEVICES, the container's GPU assignment), or lease on a device it sees");
  }

  /** Uuids compare without case, with or without the {@code GPU-} prefix. */
  static boolean same(String a, String b) {
    return strip(a).equals(strip(b));
  }

  private static String strip(String uuid) {
    String u = uuid.trim().toLowerCase(Locale.ROOT);
    return u.startsWith("gpu-") ? u.substring(4) : u;
  }
}
