package io.gpumemd.server.backend.cuda;

import java.util.List;

/**
 * How a CUDA device's segments reach clients ({@code --cuda-handles}), decided from what the
 * device reports, apart from any driver call so that every case is tested without a GPU:
 *
 * <ul>
 *   <li>{@code vmm}: {@code cuMemCreate} segments exported as POSIX file descriptors over the fd
 *       channel. Needs the device attributes {@code VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED} and
 *       {@code HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED}, and an fd channel to send them.
 *   <li>{@code legacy}: {@code cuMemAlloc} with a 64-byte {@code cuIpcGetMemHandle}, which opens
 *       only within the daemon's PID namespace.
 *   <li>{@code auto}: vmm where all of vmm's needs are met, else legacy.
 * </ul>
 *
 * Stateless and thread-safe.
 */
public final class CudaHandleChoice {
  /** The values of {@code --cuda-handles}. */
  public static final List<String> MODES = List.of("auto", "vmm", "legacy");

  private CudaHandleChoice() {}

  /** What one device supports. */
  record DeviceSupport(int ordinal, String name, boolean virtualMemory, boolean posixFd) {}

  /**
   * The handles a device uses, and why, for the start log.
   *
   * @param vmm true for VMM segments, false for legacy ones
   */
  record Decision(boolean vmm, String reason) {
    String handles() {
      return vmm ? "vmm" : "legacy";
    }
  }

  /**
   * Decides one device's handles.
   *
   * @param mode {@code auto}, {@code vmm} or {@code legacy}
   * @param fdChannel true when the daemon has an fd channel to send descriptors on
   * @throws VmmUnavailableException when {@code vmm} is asked for and the device or the daemon
   *     cannot do it; the message says what is missing and what to use instead
   */
  static Decision decide(String mode, DeviceSupport device, boolean fdChannel) {
    if (!MODES.contains(mode)) {
      throw new IllegalArgumentException("cuda-handles: '" + mode + "' (expected: auto, vmm or legacy)");
    }
    if (mode.equals("legacy")) {
      return new Decision(false, "--cuda-handles legacy");
    }
    String missing = missing(device, fdChannel);
    if (mode.equals("vmm")) {
      if (missing != null) {
        throw new VmmUnavailableException("cuda-handles: vmm, but " + missing + " (expected: a device with VMM and POSIX "
            + "file descriptor handles, and an fd channel). Use --cuda-handles legacy or auto.");
      }
      return new Decision(true, "--cuda-handles vmm");
    }
    if (missing != null) {
      return new Decision(false, "--cuda-handles auto: " + missing);
    }
    return new Decision(true,
        "--cuda-handles auto: the device supports VMM with POSIX file descriptor handles");
  }

  /** What VMM lacks on this device and daemon, or null when nothing. */
  private static String missing(DeviceSupport device, boolean fdChannel) {
    String which = "device " + device.ordinal() + " (" + device.name() + ")";
    if (!device.virtualMemory()) {
      return which + " does not report CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED";
    }
    if (!device.posixFd()) {
      return which + " does not report CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED";
    }
    if (!fdChannel) {
      return "there is no fd channel to send descriptors on (--fd-socket none, or --socket none without "
          + "--fd-socket)";
    }
    return null;
  }
}
