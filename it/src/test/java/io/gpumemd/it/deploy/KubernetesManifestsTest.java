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
import org.junit.jupiter.api.Test;

/**
 * The Kubernetes manifests under deploy/k8s, loaded as YAML and held to what their comments
 * and deploy/README.md claim, with the daemon's flags checked by the daemon's own parser.
 * (Schema validation against the Kubernetes API and the Pod Security Standards levels are
 * .ci/validate-k8s.mjs's job, run by .ci/deploy-checks.sh.)
 */
class KubernetesManifestsTest {
  private static final String GPU = "nvidia.com/gpu";
  private static final List<String> MANIFESTS = List.of("deploy/k8s/daemonset.yaml", "deploy/k8s/node-worker.yaml",
      "deploy/k8s/sidecar.yaml");
  private static final String ENFORCE = "pod-security.kubernetes.io/enforce";

  private final GpumemdImage image = new GpumemdImage();

  // --- sidecar --------------------------------------------------------------------------

  // --- every manifest -----------------------------------------------------------------------

  /** Memory crosses as file descriptors: no pod shares a PID (or IPC) namespace. */
  @Test
  void everyPod_sharesNoPidOrIpcNamespace() {
    for (Workload w : workloads()) {
      for (String field : List.of("hostPID", "hostIPC", "hostNetwork", "shareProcessNamespace")) {
        assertNull(find(w.pod, field), w.name() + " sets " + field);
      }
    }
  }

  /** Each workload lives in a Namespace of its own file, labelled with the level it passes. */
  @Test
  void everyWorkload_isInANamespaceOfItsFileThatEnforcesAPodSecurityLevel() {
    Map<String, String> expected = Map.of("deploy/k8s/daemonset.yaml", "privileged",
        "deploy/k8s/node-worker.yaml", "privileged", "deploy/k8s/sidecar.yaml", "restricted");
    for (String file : MANIFESTS) {
      List<Map<String, Object>> docs = documents(file);
      Map<String, Object> namespace = docs.stream().filter(d -> "Namespace".equals(d.get("kind"))).findFirst()
          .orElseThrow(() -> new AssertionError(file + " has no Namespace"));
      assertEquals(expected.get(file), string(namespace, "metadata", "labels", ENFORCE), file);
      String name = string(namespace, "metadata", "name");
      for (Map<String, Object> d : docs) {
        if (!"Namespace".equals(d.get("kind"))) {
          assertEquals(name, string(d, "metadata", "namespace"), file + ": " + d.get("kind") + " in the file's namespace");
        }
      }
      assertEquals(0, docs.indexOf(namespace), file + ": the Namespace comes first, so one apply creates it first");
    }
  }

  /**
   * The daemon's memory reaches workers in other PID namespaces only as VMM descriptors, so every
   * daemon asks for VMM handles. Through the environment: the flag is being added beside this
   * change, and an unknown GPUMEMD_ variable is ignored where an unknown flag would stop the
   * start; once the flag is in, the daemon's parser checks the value too.
   */
  @Test
  void everyDaemon_servesFdsBesideItsSocket_andAsksForVmmHandles() {
    for (Workload w : List.of(sidecar(), daemonSet())) {
      ServerConfig config = w.daemonConfig();
      assertTrue(config.backend().hostSegmentsByFd(), w.name() + ": host segments as descriptors");
      assertEquals(config.listeners().socket().getParent(), config.fdChannel().socket().getParent(),
          w.name() + ": the fd socket beside the gRPC socket, where clients look for it");
      assertEquals(config.listeners().socket() + ".fd", config.fdChannel().socket().toString());
      assertEquals("vmm", w.env("gpumemd").get("GPUMEMD_CUDA_HANDLES"), w.name());
    }
  }

  /** Probes: HTTP on the metrics port, no JVM per probe. */
  @Test
  void everyDaemon_probesHealthzAndReadyzOnTheMetricsPort() {
    for (Workload w : List.of(sidecar(), daemonSet())) {
      assertHttpProbes(w, w.container("gpumemd"));
    }
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
  void sidecar_sharesOnlyTheSocketDirectory_anEmptyDirTheWorkerMountsReadOnly() {
    Workload w = sidecar();
    ServerConfig config = w.daemonConfig();
    String socketDir = config.listeners().socket().getParent().toString();
    String shmDir = config.backend().shmDir().toString();
    Map<String, String> daemonMounts = w.mounts("gpumemd");
    Map<String, String> workerMounts = w.mounts("worker");
    String socketVolume = volumeAt(daemonMounts, socketDir);
    String shmVolume = volumeAt(daemonMounts, shmDir);
    assertEquals(socketDir, workerMounts.get(socketVolume), "worker mounts " + socketVolume + " where gpumemd does");
    assertEquals(Boolean.TRUE, find(w.mount("worker", socketVolume), "readOnly"), "the worker cannot touch the sockets");
    assertTrue(find(w.volume(socketVolume), "emptyDir") != null, "socket volume is an emptyDir");
    assertFalse(workerMounts.containsKey(shmVolume), "segments arrive as descriptors: the worker mounts no shm");
    assertEquals("Memory", string(w.volume(shmVolume), "emptyDir", "medium"), "gpumemd's shm volume is tmpfs");
    for (Object v : listOrEmpty(w.pod, "volumes")) {
      assertTrue(asMap(v, "volume").containsKey("emptyDir"), "emptyDirs only: " + v);
    }
    assertEquals(List.of("--target", "unix://" + config.listeners().socket(), "worker"),
        strings(get(w.container("worker"), "args"), "worker args"), "the worker connects to gpumemd's socket");
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
  void daemonSet_sharesOnlyItsSocketDirectoryThroughHostPath() {
    Workload w = daemonSet();
    ServerConfig config = w.daemonConfig();
    Map<String, String> mounts = w.mounts("gpumemd");
    String socketVolume = volumeAt(mounts, config.listeners().socket().getParent().toString());
    assertEquals("/run/gpumemd", string(w.volume(socketVolume), "hostPath", "path"));
    for (Object v : listOrEmpty(w.pod, "volumes")) {
      Map<String, Object> volume = asMap(v, "volume");
      assertTrue(volume.get("name").equals(socketVolume) || !volume.containsKey("hostPath"),
          "the socket directory is the only hostPath: " + volume);
    }
    String shmVolume = volumeAt(mounts, config.backend().shmDir().toString());
    assertEquals("Memory", string(w.volume(shmVolume), "emptyDir", "medium"), "the host backend's segments: its own tmpfs");
    assertEquals("rw-rw----", config.tenancy().socketMode(), "worker pods connect through the group");
    assertEquals("gpumemd", config.tenancy().socketGroup());
  }

  /**
   * A rolling update takes over instead of restarting: the new pod starts beside the old one
   * (surge), on the same socket directory, and takes its state; the old one waits for its pod's
   * deletion instead of exiting into a container restart.
   */
  @Test
  void daemonSet_updatesBySurgeAndTakeOver() {
    Workload w = daemonSet();
    assertEquals("RollingUpdate", string(w.workload, "spec", "updateStrategy", "type"));
    assertEquals("1", string(w.workload, "spec", "updateStrategy", "rollingUpdate", "maxSurge"));
    assertEquals("0", string(w.workload, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"));
    ServerConfig config = w.daemonConfig();
    assertTrue(config.takeOver().takeOver(), "--take-over");
    assertFalse(config.takeOver().exitAfterHandOver(), "--after-hand-over wait");
    assertEquals(config.listeners().socket().getParent(), config.takeOver().socket().getParent(),
        "the take-over socket is in the shared socket directory");
    assertEquals("vmm", config.backend().cudaHandles(), "legacy IPC handles cannot be taken over");
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
  void daemonSet_initContainerHandsTheHostPathToTheImageUser() {
    Workload w = daemonSet();
    Map<String, Object> init = w.container("prepare-dirs");
    String command = String.join(" ", strings(get(init, "command"), "command"));
    assertTrue(command.contains("chown " + image.uid() + ":" + image.gid()), command);
    for (Map.Entry<String, String> mount : w.mounts("gpumemd").entrySet()) {
      if (find(w.volume(mount.getKey()), "hostPath") != null) {
        assertTrue(command.contains(mount.getValue()), "prepare-dirs prepares " + mount.getValue() + ": " + command);
      }
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
  void nodeWorker_mountsTheDaemonSetsSocketDirectoryReadOnly_andJoinsItsGroup() {
    Workload daemon = daemonSet();
    Workload worker = nodeWorker();
    ServerConfig config = daemon.daemonConfig();
    String socketDir = config.listeners().socket().getParent().toString();
    String daemonPath = string(daemon.volume(volumeAt(daemon.mounts("gpumemd"), socketDir)), "hostPath", "path");
    String workerVolume = volumeAt(worker.mounts("worker"), socketDir);
    assertEquals(daemonPath, string(worker.volume(workerVolume), "hostPath", "path"),
        "worker mounts the daemon's node directory at " + socketDir);
    assertEquals(Boolean.TRUE, find(worker.mount("worker", workerVolume), "readOnly"));
    for (Object v : listOrEmpty(worker.pod, "volumes")) {
      Map<String, Object> volume = asMap(v, "volume");
      assertTrue(volume.get("name").equals(workerVolume) || !volume.containsKey("hostPath"),
          "the socket directory is the worker's only hostPath: " + volume);
    }
    assertTrue(strings(get(worker.pod, "securityContext", "supplementalGroups"), "groups").contains(String.valueOf(image.gid())),
        "worker joins the gpumemd group, which the sockets are 0660 for");
    assertEquals("1", string(worker.container("worker"), "resources", "limits", GPU));
    assertEquals(List.of("--target", "unix://" + config.listeners().socket(), "worker"),
        strings(get(worker.container("worker"), "args"), "worker args"));
  }

  // --- helpers ----------------------------------------------------------------------------

  /**
   * Startup and liveness ask /healthz, readiness /readyz, all as httpGet on the daemon's metrics
   * port (by the containerPort's name) on the pod's address, where the daemon binds them; no
   * host field (the kubelet asks the pod IP; Pod Security baseline forbids a host since 1.34).
   * The daemon has no TCP gRPC listener for a kubelet gRPC probe to reach.
   */
  private void assertHttpProbes(Workload w, Map<String, Object> container) {
    ServerConfig config = w.daemonConfig();
    assertFalse(config.listeners().tcpEnabled(), "no TCP listener: gRPC on the Unix socket only");
    assertEquals("$(POD_IP)", config.listeners().metricsHost(), "probes reach the pod's address");
    Map<String, String> paths = Map.of("startupProbe", "/healthz", "livenessProbe", "/healthz",
        "readinessProbe", "/readyz");
    for (Map.Entry<String, String> e : paths.entrySet()) {
      Map<String, Object> p = map(container, e.getKey());
      assertTrue(p.containsKey("httpGet") && !p.containsKey("exec") && !p.containsKey("grpc")
          && !p.containsKey("tcpSocket"), e.getKey() + " is an httpGet probe: " + p);
      Map<String, Object> http = map(p, "httpGet");
      assertEquals(e.getValue(), string(http, "path"), e.getKey());
      assertEquals(config.listeners().metricsPort(), w.containerPort("gpumemd", string(http, "port")),
          e.getKey() + " asks the metrics port");
      assertNull(http.get("host"), e.getKey() + " leaves host to the kubelet (the pod IP)");
      assertNull(http.get("scheme"), e.getKey() + ": plain HTTP, as the daemon serves it");
    }
    long startupSeconds = Long.parseLong(string(container, "startupProbe", "periodSeconds"))
        * Long.parseLong(string(container, "startupProbe", "failureThreshold"));
    assertTrue(startupSeconds >= 30, "a JVM and a CUDA context start within the startup window: " + startupSeconds + " s");
    assertTrue(Integer.parseInt(string(container, "livenessProbe", "failureThreshold")) > 1,
        "one slow answer (a GC pause) does not restart the daemon");
  }

  private void assertScrapeAnnotations(Workload w, Map<String, Object> annotations) {
    int metricsPort = w.daemonConfig().listeners().metricsPort();
    assertEquals("true", annotations.get("prometheus.io/scrape"));
    assertEquals(String.valueOf(metricsPort), annotations.get("prometheus.io/port"));
    assertEquals("/metrics", annotations.get("prometheus.io/path"));
    assertEquals(metricsPort, w.containerPort("gpumemd", "metrics"), "containerPort metrics");
  }


  private Workload sidecar() {
    return workload("deploy/k8s/sidecar.yaml", "Deployment");
  }

  private Workload nodeWorker() {
    return workload("deploy/k8s/node-worker.yaml", "Deployment");
  }

  private List<Workload> workloads() {
    return List.of(daemonSet(), nodeWorker(), sidecar());
  }

  private Workload workload(String file, String kind) {
    return new Workload(documents(file).stream().filter(d -> kind.equals(d.get("kind"))).findFirst()
        .orElseThrow(() -> new AssertionError(file + ": no " + kind)), image);
  }

  private Workload daemonSet() {
    return workload("deploy/k8s/daemonset.yaml", "DaemonSet");
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

    String name() {
      return workload.get("kind") + "/" + string(workload, "metadata", "name");
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

    Map<String, Object> mount(String container, String volume) {
      return listOrEmpty(container(container), "volumeMounts").stream().map(m -> asMap(m, "volumeMount"))
          .filter(m -> volume.equals(m.get("name"))).findFirst()
          .orElseThrow(() -> new AssertionError(container + " does not mount " + volume));
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
      return image.config(strings(get(c, "args"), "args"), env("gpumemd"));
    }

    /** A container's literal environment (values from the pod, such as POD_IP, left out). */
    Map<String, String> env(String container) {
      Map<String, String> env = new LinkedHashMap<>();
      for (Object e : listOrEmpty(container(container), "env")) {
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
