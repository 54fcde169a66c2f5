package io.gpumemd.it.deploy;

import static io.gpumemd.it.deploy.RepoFiles.asMap;
import static io.gpumemd.it.deploy.RepoFiles.find;
import static io.gpumemd.it.deploy.RepoFiles.get;
import static io.gpumemd.it.deploy.RepoFiles.listOrEmpty;
import static io.gpumemd.it.deploy.RepoFiles.map;
import static io.gpumemd.it.deploy.RepoFiles.string;
import static io.gpumemd.it.deploy.RepoFiles.strings;
import static io.gpumemd.it.deploy.RepoFiles.volumeAt;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.testing.TestDaemon;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * docker-compose.yml, loaded as YAML (merge keys resolved, as Compose does) and held to what its
 * header claims, for both profiles: {@code gpu} (gpumemd + worker) and {@code nogpu}
 * (gpumemd-nogpu + worker-nogpu). Compose's own validation runs in .ci/deploy-checks.sh.
 */
class ComposeFileTest {
  private final GpumemdImage image = new GpumemdImage();
  private final Map<String, Object> compose = RepoFiles.yamlDocuments("docker-compose.yml").get(0);

  @Test
  void everyServiceHasAProfile_soThatAVariantIsChosenExplicitly() {
    Map<String, Object> services = map(compose, "services");
    assertEquals(List.of("gpumemd", "worker", "gpumemd-nogpu", "worker-nogpu"), List.copyOf(services.keySet()));
    assertEquals(List.of("gpu"), profiles("gpumemd"));
    assertEquals(List.of("gpu"), profiles("worker"));
    assertEquals(List.of("nogpu"), profiles("gpumemd-nogpu"));
    assertEquals(List.of("nogpu"), profiles("worker-nogpu"));
  }

  @Test
  void gpu_daemonAndWorkerReserveNvidiaGpus() {
    assertEquals("cuda", daemonConfig("gpumemd").backend().kind());
    for (String service : List.of("gpumemd", "worker")) {
      List<Object> devices = listOrEmpty(service(service), "deploy", "resources", "reservations", "devices");
      assertFalse(devices.isEmpty(), service + " reserves a GPU");
      Map<String, Object> device = asMap(devices.get(0), "device");
      assertEquals("nvidia", device.get("driver"));
      assertTrue(strings(device.get("capabilities"), "capabilities").contains("gpu"));
    }
  }

  @Test
  void gpu_workerSharesOnlyTheSocketVolumeWithTheDaemon() {
    assertWorkerJoinsDaemon("worker", "gpumemd");
  }

  @Test
  void nogpu_selectsTheHostBackendAndRequestsNoGpu() {
    ServerConfig config = daemonConfig("gpumemd-nogpu");
    assertEquals("host", config.backend().kind());
    for (String service : List.of("gpumemd-nogpu", "worker-nogpu")) {
      Map<String, Object> s = service(service);
      assertNull(find(s, "deploy", "resources", "reservations", "devices"), service + " reserves no device");
      assertNull(s.get("gpus"), service + " asks for no GPUs");
      assertNull(s.get("runtime"), service + " needs no nvidia runtime");
    }
  }

  @Test
  void nogpu_workerSharesOnlyTheSocketVolumeWithTheDaemon() {
    assertWorkerJoinsDaemon("worker-nogpu", "gpumemd-nogpu");
  }

  @Test
  void shmVolume_isTmpfsOwnedByTheImageUser() {
    Map<String, Object> shm = map(compose, "volumes", volumeAt(mounts("gpumemd"), daemonConfig("gpumemd").backend().shmDir().toString()));
    assertEquals("tmpfs", string(shm, "driver_opts", "type"));
    String options = string(shm, "driver_opts", "o");
    assertTrue(options.contains("uid=" + image.uid()) && options.contains("gid=" + image.gid()),
        "the non-root daemon can write the tmpfs: " + options);
  }

  @Test
  void daemon_publishesOnlyMetrics_onLoopback() {
    ServerConfig config = daemonConfig("gpumemd");
    assertFalse(config.listeners().tcpEnabled(), "gRPC on the shared socket only");
    List<String> ports = strings(get(service("gpumemd"), "ports"), "ports");
    assertEquals(List.of("127.0.0.1:" + config.listeners().metricsPort() + ":" + config.listeners().metricsPort()), ports);
  }

  @Test
  void daemon_stopGracePeriodOutlastsTheDrain() {
    for (String service : List.of("gpumemd", "gpumemd-nogpu")) {
      String grace = string(service(service), "stop_grace_period");
      assertTrue(grace.endsWith("s"), grace);
      long millis = Long.parseLong(grace.substring(0, grace.length() - 1)) * 1000;
      assertTrue(millis > daemonConfig(service).drainTimeoutMillis(), service + ": " + grace);
    }
  }

  /**
   * The healthcheck's own command, run by bash against a live daemon (its metrics port put in
   * place of 9464): 0 while ready, not 0 once the daemon's socket is gone.
   */
  @Test
  void healthcheck_commandPassesOnAReadyDaemon_andFailsOnANotReadyOne() throws Exception {
    List<String> check = strings(get(service("gpumemd"), "healthcheck", "test"), "healthcheck");
    int port;
    try (java.net.ServerSocket s = new java.net.ServerSocket(0)) {
      port = s.getLocalPort();
    }
    try (TestDaemon daemon = TestDaemon.start("--metrics-host", "127.0.0.1", "--metrics-port", Integer.toString(port))) {
      String command = check.get(3).replace("/dev/tcp/127.0.0.1/" + daemonConfig("gpumemd").listeners().metricsPort(),
          "/dev/tcp/127.0.0.1/" + port);
      assertEquals(0, bash(command), "ready: " + command);
      java.nio.file.Files.delete(daemon.server().socketPath());
      assertEquals(1, bash(command), "not ready once the socket is gone: " + command);
    }
  }

  private static int bash(String command) throws Exception {
    Process p = new ProcessBuilder("bash", "-c", command).redirectErrorStream(true).start();
    p.getInputStream().readAllBytes();
    assertTrue(p.waitFor(30, java.util.concurrent.TimeUnit.SECONDS), command);
    return p.exitValue();
  }

  /**
   * Memory crosses as file descriptors: the worker joins no namespace of the daemon's and mounts
   * only the socket directory (read-only), where the fd channel's socket sits beside the gRPC one.
   */
  private void assertWorkerJoinsDaemon(String worker, String daemon) {
    for (String namespace : List.of("pid", "ipc", "network_mode")) {
      assertNull(service(worker).get(namespace), worker + " sets " + namespace);
    }
    ServerConfig config = daemonConfig(daemon);
    assertTrue(config.backend().hostSegmentsByFd(), daemon + " hands host segments out as descriptors");
    assertEquals(config.listeners().socket() + ".fd", config.fdChannel().socket().toString());
    assertEquals("vmm", string(service(daemon), "environment", "GPUMEMD_CUDA_HANDLES"),
        daemon + ": CUDA memory only as VMM descriptors, which open in the worker's PID namespace");
    String socketDir = config.listeners().socket().getParent().toString();
    Map<String, String> daemonMounts = mounts(daemon);
    String volume = volumeAt(daemonMounts, socketDir);
    assertTrue(map(compose, "volumes").containsKey(volume), volume + " is a named volume");
    List<String> workerVolumes = strings(get(service(worker), "volumes"), "volumes");
    assertEquals(List.of(volume + ":" + socketDir + ":ro"), workerVolumes,
        worker + " mounts only " + volume + ", read-only, at " + socketDir + " like " + daemon);
    List<String> command = strings(get(service(worker), "command"), "command");
    assertEquals(List.of("--target", "unix://" + config.listeners().socket(), "worker"), command);
    List<String> entrypoint = strings(get(service(worker), "entrypoint"), "entrypoint");
    assertEquals("/opt/gpumemd/gpumemctl.jar", entrypoint.get(entrypoint.indexOf("-jar") + 1));
    assertEquals("service_healthy", string(service(worker), "depends_on", daemon, "condition"));
    List<String> check = strings(get(service(daemon), "healthcheck", "test"), "healthcheck");
    assertEquals(List.of("CMD", "bash", "-c"), check.subList(0, 3), "a shell, not a JVM, per check");
    assertTrue(check.get(3).contains("/dev/tcp/127.0.0.1/" + config.listeners().metricsPort())
        && check.get(3).contains("GET /readyz "), daemon + "'s healthcheck asks /readyz on the metrics port: " + check);
  }

  private ServerConfig daemonConfig(String service) {
    Map<String, Object> s = service(service);
    assertNull(s.get("entrypoint"), service + " keeps the image's entrypoint");
    Map<String, String> env = new LinkedHashMap<>();
    Object environment = s.get("environment");
    if (environment != null) {
      asMap(environment, "environment").forEach((k, v) -> env.put(k, String.valueOf(v)));
    }
    return image.config(strings(get(s, "command"), "command"), env);
  }

  private Map<String, String> mounts(String service) {
    Map<String, String> out = new LinkedHashMap<>();
    for (String volume : strings(get(service(service), "volumes"), "volumes")) {
      String[] parts = volume.split(":");
      out.put(parts[0], parts[1]);
    }
    return out;
  }


  private List<String> profiles(String service) {
    return strings(get(service(service), "profiles"), "profiles");
  }

  private Map<String, Object> service(String name) {
    return map(compose, "services", name);
  }
}
