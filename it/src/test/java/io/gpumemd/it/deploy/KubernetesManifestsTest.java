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
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

/**
 * The Kubernetes manifests under deploy/k8s, loaded as YAML and held to what their comments
 * and deploy/README.md claim, with the daemon's flags checked by the daemon's own parser.
 * (Schema validation against the Kubernetes API is .ci/deploy-checks.sh's job.)
 */
class KubernetesManifestsTest {
  private static final String GPU = "nvidia.com/gpu";
  /** The health service names the daemon registers (GpumemdServer). */
  private static final Set<String> HEALTH_SERVICES = Set.of("", "gpumemd.v1.Allocator", "gpumemd.v1.Admin");

  private final GpumemdImage image = new GpumemdImage();

  // --- sidecar --------------------------------------------------------------------------

  @Test
  void sidecar_sharesProcessNamespace() {
    assertEquals(Boolean.TRUE, find(sidecar().pod, "shareProcessNamespace"), "legacy CUDA IPC needs one PID namespace");
  }

  @Test
  void sidecar_gpumemdIsANativeSidecarThatStartsBeforeTheWorker() {
    Workload w = sidecar();
    Map<String, Object> gpumemd = w.container("gpumemd");
    assertTrue(listOrEmpty(w.pod, "initContainers").contains(gpumemd), "gpumemd is an init container");
    assertEquals("Always", string(gpumemd, "restartPolicy"), "restartable: a native sidecar");
    assertTrue(find(gpumemd, "startupProbe") != null, "the worker starts once gpumemd's startupProbe passes");
  }

  @Test
  void sidecar_bothContainersMountTheSocketAndShmVolumesAtTheDaemonsPaths() {
    Workload w = sidecar();
    ServerConfig config = w.daemonConfig();
    String socketDir = config.listeners().socket().getParent().toString();
    String shmDir = config.backend().shmDir().toString();
    Map<String, String> daemonMounts = w.mounts("gpumemd");
    Map<String, String> workerMounts = w.mounts("worker");
    String socketVolume = volumeAt(daemonMounts, socketDir);
    String shmVolume = volumeAt(daemonMounts, shmDir);
    assertEquals(socketDir, workerMounts.get(socketVolume), "worker mounts " + socketVolume + " where gpumemd does");
    assertEquals(shmDir, workerMounts.get(shmVolume), "worker mounts " + shmVolume + " where gpumemd does");
    assertTrue(find(w.volume(socketVolume), "emptyDir") != null, "socket volume is an emptyDir");
    assertEquals("Memory", string(w.volume(shmVolume), "emptyDir", "medium"), "shm volume is tmpfs");
    assertEquals(List.of("--target", "unix://" + config.listeners().socket(), "worker"),
        strings(get(w.container("worker"), "args"), "worker args"), "the worker connects to gpumemd's socket");
  }

  @Test
  void sidecar_probesRunGpumemctlHealthOverTheSocket() {
    Workload w = sidecar();
    assertHealthProbes(w, w.container("gpumemd"));
  }

  @Test
  void sidecar_gpumemdRequestsTheGpuAndUsesTheCudaBackend() {
    Workload w = sidecar();
    assertEquals("1", string(w.container("gpumemd"), "resources", "limits", GPU));
    assertNull(find(w.container("worker"), "resources", "limits", GPU),
        "a second nvidia.com/gpu request would be another GPU (see the manifest's header)");
    assertEquals("cuda", w.daemonConfig().backend().kind());
  }

  @Test
  void sidecar_scrapeAnnotationsMatchTheMetricsPort() {
    Workload w = sidecar();
    assertScrapeAnnotations(w, w.annotations);
  }

  @Test
  void sidecar_everyContainerHasRequestsAndLimits() {
    Workload w = sidecar();
    for (Map<String, Object> c : w.containers()) {
      assertTrue(find(c, "resources", "requests", "memory") != null, c.get("name") + " requests memory");
      assertTrue(find(c, "resources", "requests", "cpu") != null, c.get("name") + " requests cpu");
      assertTrue(find(c, "resources", "limits", "memory") != null, c.get("name") + " limits memory");
    }
  }

  @Test
  void sidecar_runsAsTheImageUserAndOutlastsTheDrain() {
    Workload w = sidecar();
    assertEquals(String.valueOf(image.uid()), string(w.pod, "securityContext", "runAsUser"),
        "both containers run as the user the socket and segment files belong to");
    assertEquals(Boolean.TRUE, find(w.pod, "securityContext", "runAsNonRoot"));
    long graceMillis = Long.parseLong(string(w.pod, "terminationGracePeriodSeconds")) * 1000;
    assertTrue(graceMillis > w.daemonConfig().drainTimeoutMillis(),
        "terminationGracePeriodSeconds exceeds --drain-timeout-ms: " + graceMillis);
  }

  // --- DaemonSet --------------------------------------------------------------------------

  @Test
  void daemonSet_usesHostPidAndAHostPathSocketDirectory() {
    Workload w = daemonSet();
    assertEquals(Boolean.TRUE, find(w.pod, "hostPID"), "cross-pod CUDA IPC needs the host PID namespace");
    ServerConfig config = w.daemonConfig();
    Map<String, String> mounts = w.mounts("gpumemd");
    String socketVolume = volumeAt(mounts, config.listeners().socket().getParent().toString());
    assertEquals("/run/gpumemd", string(w.volume(socketVolume), "hostPath", "path"));
    String shmVolume = volumeAt(mounts, config.backend().shmDir().toString());
    assertTrue(find(w.volume(shmVolume), "hostPath", "path") != null, "shm directory on the node");
  }

  @Test
  void daemonSet_runsOnGpuNodesWithoutTakingTheirGpus() {
    Workload w = daemonSet();
    assertFalse(map(w.pod, "nodeSelector").isEmpty(), "nodeSelector for GPU nodes");
    assertTrue(listOrEmpty(w.pod, "tolerations").stream()
        .anyMatch(t -> GPU.equals(asMap(t, "toleration").get("key"))), "tolerates the nvidia.com/gpu taint");
    assertNull(find(w.container("gpumemd"), "resources", "limits", GPU),
        "no nvidia.com/gpu request: it would take the GPUs from the worker pods");
    assertEquals("cuda", w.daemonConfig().backend().kind());
  }

  @Test
  void daemonSet_probesRunGpumemctlHealthOverTheSocket() {
    Workload w = daemonSet();
    assertHealthProbes(w, w.container("gpumemd"));
  }

  @Test
  void daemonSet_initContainerHandsTheHostPathsToTheImageUser() {
    Workload w = daemonSet();
    Map<String, Object> init = w.container("prepare-dirs");
    String command = String.join(" ", strings(get(init, "command"), "command"));
    assertTrue(command.contains("chown " + image.uid() + ":" + image.gid()), command);
    for (String dir : w.mounts("gpumemd").values()) {
      if (dir.equals("/tmp")) {
        continue;
      }
      assertTrue(command.contains(dir), "prepare-dirs prepares " + dir + ": " + command);
    }
  }

  /** The daemon binds metrics to 127.0.0.1 by default; both pods bind their own address instead. */
  @Test
  void metrics_bindThePodAddressExplicitly() {
    for (Workload w : List.of(sidecar(), daemonSet())) {
      assertEquals("$(POD_IP)", w.daemonConfig().listeners().metricsHost());
      Map<String, Object> podIp = listOrEmpty(w.container("gpumemd"), "env").stream().map(e -> asMap(e, "env"))
          .filter(e -> "POD_IP".equals(e.get("name"))).findFirst().orElseThrow(() -> new AssertionError("no POD_IP"));
      assertEquals("status.podIP", string(podIp, "valueFrom", "fieldRef", "fieldPath"));
    }
  }

  @Test
  void metricsService_selectsTheDaemonSetPodsOnTheMetricsPort() {
    Workload w = daemonSet();
    Map<String, Object> service = documents("deploy/k8s/daemonset.yaml").stream()
        .filter(d -> "Service".equals(d.get("kind"))).findFirst().orElseThrow(() -> new AssertionError("no Service"));
    assertEquals(map(w.workload, "spec", "selector", "matchLabels"), map(service, "spec", "selector"));
    assertEquals("None", string(service, "spec", "clusterIP"), "headless: one endpoint per node");
    Map<String, Object> port = asMap(listOrEmpty(service, "spec", "ports").get(0), "port");
    int metricsPort = w.daemonConfig().listeners().metricsPort();
    assertEquals(metricsPort, w.containerPort("gpumemd", string(port, "targetPort")));
    assertEquals(String.valueOf(metricsPort), string(port, "port"));
    assertScrapeAnnotations(w, map(service, "metadata", "annotations"));
    assertScrapeAnnotations(w, w.annotations);
  }

  @Test
  void nodeWorker_joinsTheDaemonSetsPidNamespaceMountsAndGroup() {
    Workload daemon = daemonSet();
    Workload worker = new Workload(documents("deploy/k8s/node-worker.yaml").get(0), image);
    assertEquals(Boolean.TRUE, find(worker.pod, "hostPID"));
    Map<String, String> daemonMounts = daemon.mounts("gpumemd");
    Map<String, String> workerMounts = worker.mounts("worker");
    ServerConfig config = daemon.daemonConfig();
    for (String dir : List.of(config.listeners().socket().getParent().toString(), config.backend().shmDir().toString())) {
      String daemonPath = string(daemon.volume(volumeAt(daemonMounts, dir)), "hostPath", "path");
      String workerPath = string(worker.volume(volumeAt(workerMounts, dir)), "hostPath", "path");
      assertEquals(daemonPath, workerPath, "worker mounts the daemon's node directory at " + dir);
    }
    assertEquals("gpumemd", config.backend().shmGroup(), "socket and segment files are group-accessible");
    assertTrue(strings(get(worker.pod, "securityContext", "supplementalGroups"), "groups").contains(String.valueOf(image.gid())),
        "worker joins the gpumemd group");
    assertEquals("1", string(worker.container("worker"), "resources", "limits", GPU));
    assertEquals(List.of("--target", "unix://" + config.listeners().socket(), "worker"),
        strings(get(worker.container("worker"), "args"), "worker args"));
  }

  // --- helpers ----------------------------------------------------------------------------

  /**
   * Every probe execs gpumemctl (the jar the image ships) against the daemon's own socket and
   * asks a service the daemon reports health for; the daemon has no TCP listener for a kubelet
   * gRPC probe to reach (they are plaintext, and plaintext TCP on the pod IP is refused).
   */
  private void assertHealthProbes(Workload w, Map<String, Object> container) {
    ServerConfig config = w.daemonConfig();
    assertFalse(config.listeners().tcpEnabled(), "no TCP listener: gRPC on the Unix socket only");
    assertTrue(listOrEmpty(container, "ports").stream().map(p -> asMap(p, "port"))
        .noneMatch(p -> "grpc".equals(p.get("name"))), "no gRPC containerPort");
    for (String probe : List.of("startupProbe", "livenessProbe", "readinessProbe")) {
      Map<String, Object> p = map(container, probe);
      assertTrue(p.containsKey("exec") && !p.containsKey("grpc") && !p.containsKey("httpGet")
          && !p.containsKey("tcpSocket"), probe + " is an exec probe: " + p);
      List<String> command = strings(get(p, "exec", "command"), probe + " command");
      assertEquals("java", command.get(0), probe);
      int jar = command.indexOf("-jar");
      assertTrue(jar > 0, probe + " runs a jar: " + command);
      assertEquals(image.ctlJar(), command.get(jar + 1), probe + " runs the image's gpumemctl");
      List<String> ctlArgs = command.subList(jar + 2, command.size());
      int target = ctlArgs.indexOf("--target");
      assertEquals("unix://" + config.listeners().socket(), ctlArgs.get(target + 1), probe + " asks the daemon's socket");
      int health = ctlArgs.indexOf("health");
      assertTrue(health > target, probe + " runs gpumemctl health: " + ctlArgs);
      int service = ctlArgs.indexOf("--service");
      String asked = service < 0 ? "" : ctlArgs.get(service + 1);
      assertTrue(HEALTH_SERVICES.contains(asked), probe + " asks a service the daemon reports health for: " + asked);
      assertTrue(Integer.parseInt(string(p, "timeoutSeconds")) >= 5,
          probe + ": a JVM starts per probe, the default 1 s timeout is too short");
    }
    List<String> readiness = strings(get(container, "readinessProbe", "exec", "command"), "readiness command");
    assertEquals("gpumemd.v1.Allocator", readiness.get(readiness.indexOf("--service") + 1),
        "readiness follows the Allocator, NOT_SERVING while draining");
  }

  private void assertScrapeAnnotations(Workload w, Map<String, Object> annotations) {
    int metricsPort = w.daemonConfig().listeners().metricsPort();
    assertEquals("true", annotations.get("prometheus.io/scrape"));
    assertEquals(String.valueOf(metricsPort), annotations.get("prometheus.io/port"));
    assertEquals("/metrics", annotations.get("prometheus.io/path"));
    assertEquals(metricsPort, w.containerPort("gpumemd", "metrics"), "containerPort metrics");
  }


  private Workload sidecar() {
    return new Workload(documents("deploy/k8s/sidecar.yaml").get(0), image);
  }

  private Workload daemonSet() {
    return new Workload(documents("deploy/k8s/daemonset.yaml").stream()
        .filter(d -> "DaemonSet".equals(d.get("kind"))).findFirst()
        .orElseThrow(() -> new AssertionError("no DaemonSet")), image);
  }

  private static List<Map<String, Object>> documents(String file) {
    return RepoFiles.yamlDocuments(file);
  }

  /** A Deployment or DaemonSet: its pod template and the containers in it. */
  private static final class Workload {
    final Map<String, Object> workload;
    final Map<String, Object> pod;
    final Map<String, Object> annotations;
    private final GpumemdImage image;

    Workload(Map<String, Object> workload, GpumemdImage image) {
      this.workload = workload;
      this.pod = map(workload, "spec", "template", "spec");
      Object a = find(workload, "spec", "template", "metadata", "annotations");
      this.annotations = a == null ? Map.of() : asMap(a, "annotations");
      this.image = image;
    }

    List<Map<String, Object>> containers() {
      List<Map<String, Object>> all = new ArrayList<>();
      for (String kind : List.of("initContainers", "containers")) {
        listOrEmpty(pod, kind).forEach(c -> all.add(asMap(c, kind)));
      }
      return all;
    }

    Map<String, Object> container(String name) {
      return containers().stream().filter(c -> name.equals(c.get("name"))).findFirst()
          .orElseThrow(() -> new AssertionError("no container " + name));
    }

    /** volume name to mount path. */
    Map<String, String> mounts(String container) {
      Map<String, String> out = new LinkedHashMap<>();
      for (Object m : listOrEmpty(container(container), "volumeMounts")) {
        Map<String, Object> mount = asMap(m, "volumeMount");
        out.put(string(mount, "name"), string(mount, "mountPath"));
      }
      return out;
    }

    Map<String, Object> volume(String name) {
      return listOrEmpty(pod, "volumes").stream().map(v -> asMap(v, "volume"))
          .filter(v -> name.equals(v.get("name"))).findFirst()
          .orElseThrow(() -> new AssertionError("no volume " + name));
    }

    int containerPort(String container, String portName) {
      return listOrEmpty(container(container), "ports").stream().map(p -> asMap(p, "port"))
          .filter(p -> portName.equals(p.get("name"))).map(p -> Integer.parseInt(string(p, "containerPort")))
          .findFirst().orElseThrow(() -> new AssertionError(container + " has no port named " + portName));
    }

    /** gpumemd's configuration: the image's entrypoint flags, then the container's args. */
    ServerConfig daemonConfig() {
      Map<String, Object> c = container("gpumemd");
      assertNull(c.get("command"), "gpumemd keeps the image's entrypoint");
      return image.config(strings(get(c, "args"), "args"), env(c));
    }

    private static Map<String, String> env(Map<String, Object> container) {
      Map<String, String> env = new LinkedHashMap<>();
      for (Object e : listOrEmpty(container, "env")) {
        Map<String, Object> var = asMap(e, "env");
        if (var.containsKey("valueFrom")) {
          continue; // from the pod (POD_IP): not a GPUMEMD_ setting
        }
        env.put(string(var, "name"), string(var, "value"));
      }
      return env;
    }
  }
}
