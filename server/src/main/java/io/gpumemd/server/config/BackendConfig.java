package io.gpumemd.server.config;

import io.gpumemd.server.backend.cuda.CudaHandleChoice;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

/**
 * Which memory backend the daemon uses, and the simulated devices of the host backend; part of
 * {@link ServerConfig}.
 *
 * @param kind {@code auto}, {@code host} or {@code cuda} ({@code --backend})
 * @param hostDevices simulated devices of the host backend ({@code --host-devices})
 * @param hostDeviceBytes capacity of each ({@code --host-device-bytes})
 * @param shmDir directory of the shared-memory segment files ({@code --shm-dir})
 * @param shmGroup group that may also open them, or empty for the owner only ({@code --shm-group})
 * @param hostSegmentsByFd clients get host segments as file descriptors from the fd channel, not
 *     as paths ({@code --host-segments fd}, the default where the daemon has an fd socket)
 * @param cudaHandles how CUDA segments reach clients: {@code auto}, {@code vmm} (descriptors over
 *     the fd channel) or {@code legacy} (CUDA IPC handles) ({@code --cuda-handles})
 */
public record BackendConfig(String kind, int hostDevices, long hostDeviceBytes, Path shmDir, String shmGroup,
    boolean hostSegmentsByFd, String cudaHandles) {

  /** Reads and checks the backend options; a problem is recorded in {@code s}. */
  static BackendConfig from(Settings s) {
    long hostDeviceBytes = s.size("host-device-bytes");
    if (s.valid("host-device-bytes") && (hostDeviceBytes < (2L << 20) || hostDeviceBytes % 512 != 0)) {
      s.problem(s.get("host-device-bytes"), "at least 2MiB, a multiple of 512");
    }
    if (s.text("shm-dir").isEmpty()) {
      s.problem(s.get("shm-dir"), "a directory path");
    }
    return new BackendConfig(
        s.choice("backend", List.of("auto", "host", "cuda")),
        (int) s.integer("host-devices", 1, 64),
        hostDeviceBytes,
        Path.of(s.text("shm-dir")),
        s.text("shm-group"),
        FdChannelConfig.segmentsByFd(s),
        s.choice("cuda-handles", CudaHandleChoice.MODES));
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("backend", kind);
    values.put("host-devices", hostDevices);
    values.put("host-device-bytes", hostDeviceBytes);
    values.put("shm-dir", shmDir);
    values.put("shm-group", shmGroup.isEmpty() ? "(owner only)" : shmGroup);
    values.put("host-segments", hostSegmentsByFd ? "fd" : "path");
    values.put("cuda-handles", cudaHandles);
  }
}
