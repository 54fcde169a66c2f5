package io.gpumemd.server.backend;

/**
 * What a backend reports about one device at start. Immutable.
 *
 * @param ordinal device ordinal, the {@code device} of the API
 * @param name human-readable name (GPU model, or {@code host-shm})
 * @param uuid stable identifier (GPU UUID, or generated for host devices)
 * @param backend backend name ({@code cuda} or {@code host})
 * @param capacityBytes total memory of the device
 * @param freeBytesAtStart free memory when the daemon started
 * @param cudaHandles how a CUDA device's segments reach clients: {@code vmm} or {@code legacy};
 *     empty on other backends
 */
public record DeviceInfo(int ordinal, String name, String uuid, String backend, long capacityBytes,
    long freeBytesAtStart, String cudaHandles) {

  /** A device with no CUDA handles (the host backend, test backends). */
  public DeviceInfo(int ordinal, String name, String uuid, String backend, long capacityBytes, long freeBytesAtStart) {
    this(ordinal, name, uuid, backend, capacityBytes, freeBytesAtStart, "");
  }
}
