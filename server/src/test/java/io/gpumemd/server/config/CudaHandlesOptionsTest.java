package io.gpumemd.server.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code --cuda-handles}: its default, its three layers (flag, environment, config file), bad
 * values, and vmm without an fd channel to send descriptors on.
 */
class CudaHandlesOptionsTest {
  @TempDir
  Path dir;

  private static ServerConfig load(Map<String, String> env, String... args) {
    return ServerOptions.parse(args, env);
  }

  private static void rejects(String message, String... args) {
    ConfigException e = assertThrows(ConfigException.class, () -> ServerOptions.parse(args, Map.of()));
    assertTrue(e.getMessage().contains(message), "'" + e.getMessage() + "' should contain '" + message + "'");
  }

  @Test
  void default_isAuto_andTheStartLogShowsIt() {
    ServerConfig c = load(Map.of());

    assertEquals("auto", c.backend().cudaHandles());
    assertEquals("default", c.sources().get("cuda-handles"));
    assertTrue(c.describe().contains("cuda-handles = auto"), c.describe());
  }

  @Test
  void flag_envAndFile_inThatOrder() throws Exception {
    Path file = Files.writeString(dir.resolve("gpumemd.properties"), "cuda-handles = vmm\n");

    assertEquals("vmm", load(Map.of(), "--config", file.toString()).backend().cudaHandles());
    assertEquals("legacy", load(Map.of("GPUMEMD_CUDA_HANDLES", "legacy"), "--config", file.toString())
        .backend().cudaHandles());
    assertEquals("auto", load(Map.of("GPUMEMD_CUDA_HANDLES", "legacy"), "--cuda-handles", "auto")
        .backend().cudaHandles());
  }

  @Test
  void anUnknownValue_isRefusedWithTheChoices() {
    rejects("cuda-handles: 'ipc' (expected: auto, vmm or legacy)", "--cuda-handles", "ipc");
  }

  @Test
  void vmm_onACudaBackend_needsAnFdChannel() {
    rejects("fd-socket: 'none' (expected: a socket path: --cuda-handles vmm hands CUDA segments out over the fd "
        + "channel)", "--backend", "cuda", "--cuda-handles", "vmm", "--fd-socket", "none");
    rejects("--cuda-handles vmm hands CUDA segments out", "--cuda-handles", "vmm", "--socket", "none",
        "--listen", "127.0.0.1:0");
    assertEquals("vmm", load(Map.of(), "--backend", "host", "--cuda-handles", "vmm", "--fd-socket", "none")
        .backend().cudaHandles(), "no CUDA backend, nothing to send");
  }

  @Test
  void auto_withoutAnFdChannel_isAccepted() {
    assertEquals("auto", load(Map.of(), "--backend", "cuda", "--fd-socket", "none").backend().cudaHandles(),
        "auto then decides legacy at start");
  }
}
