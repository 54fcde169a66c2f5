// The Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
// as checks of a pod template, for .ci/validate-k8s.mjs. The rules and their allowed values follow
// the Pod Security Admission controller's checks (k8s.io/pod-security-admission/policy, level
// "latest" as of Kubernetes 1.34), each named by that controller's check id. What is left out:
// the Windows-only variants, and the version-specific relaxations for older clusters; so a pod
// that passes here passes "latest".
//
//   baseline:   hostProcess, hostNamespaces (hostNetwork, hostPID, hostIPC), privileged,
//               capabilities_baseline (add only the default set below), hostPathVolumes,
//               hostPorts, appArmorProfile, seLinuxOptions, procMount, seccompProfile_baseline
//               (not Unconfined), sysctls (the safe set below), hostProbesAndHostLifecycle (no
//               host field in probes and lifecycle handlers, 1.34)
//   restricted: everything in baseline, plus restrictedVolumes (configMap, csi, downwardAPI,
//               emptyDir, ephemeral, image, persistentVolumeClaim, projected, secret only),
//               allowPrivilegeEscalation (false, set in every container), runAsNonRoot (true for
//               the pod or every container, false nowhere), runAsUser (never 0),
//               seccompProfile_restricted (RuntimeDefault or Localhost for the pod or every
//               container), capabilities_restricted (drop ALL in every container; add only
//               NET_BIND_SERVICE)
//
// checkPod(pod) returns the violations of both levels: [{level, check, detail}].

export const LEVELS = ["privileged", "baseline", "restricted"];

const BASELINE_CAPABILITIES = new Set(["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
  "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]);
const SAFE_SYSCTLS = new Set(["kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
  "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
  "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
  "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]);
const SELINUX_TYPES = new Set(["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"]);
const RESTRICTED_VOLUMES = new Set(["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
  "persistentVolumeClaim", "projected", "secret"]);

/** Every container of a pod spec, with the list it came from. */
export function containersOf(spec) {
  const out = [];
  for (const kind of ["initContainers", "containers", "ephemeralContainers"]) {
    for (const c of spec[kind] ?? []) out.push({ kind, c });
  }
  return out;
}

/**
 * @param pod {metadata, spec} of a pod, or of a workload's pod template
 * @return the violations: [{level: "baseline"|"restricted", check, detail}]
 */
export function checkPod(pod) {
  const meta = pod.metadata ?? {};
  const spec = pod.spec ?? {};
  const podSc = spec.securityContext ?? {};
  const containers = containersOf(spec);
  const found = [];
  const fail = (level, check, detail) => found.push({ level, check, detail });
  const names = (pred) => containers.filter(({ c }) => pred(c, c.securityContext ?? {})).map(({ c }) => c.name);
  const each = (level, check, what, pred) => {
    const bad = names(pred);
    if (bad.length > 0) fail(level, check, `${what}: ${bad.join(", ")}`);
  };

  // --- baseline ---
  if (podSc.windowsOptions?.hostProcess === true || names((c, sc) => sc.windowsOptions?.hostProcess === true).length) {
    fail("baseline", "hostProcess", "windowsOptions.hostProcess=true");
  }
  for (const f of ["hostNetwork", "hostPID", "hostIPC"]) {
    if (spec[f] === true) fail("baseline", "hostNamespaces", `${f}=true`);
  }
  each("baseline", "privileged", "securityContext.privileged=true", (c, sc) => sc.privileged === true);
  for (const { c } of containers) {
    const extra = (c.securityContext?.capabilities?.add ?? []).filter((x) => !BASELINE_CAPABILITIES.has(x));
    if (extra.length) fail("baseline", "capabilities_baseline", `${c.name} adds ${extra.join(", ")}`);
  }
  const hostPaths = (spec.volumes ?? []).filter((v) => v.hostPath != null).map((v) => v.name);
  if (hostPaths.length) fail("baseline", "hostPathVolumes", `hostPath volumes: ${hostPaths.join(", ")}`);
  for (const { c } of containers) {
    const ports = (c.ports ?? []).filter((p) => p.hostPort != null && p.hostPort !== 0);
    if (ports.length) fail("baseline", "hostPorts", `${c.name} uses hostPort ${ports.map((p) => p.hostPort).join(", ")}`);
  }
  const badAppArmor = (p) => p != null && p.type !== "RuntimeDefault" && p.type !== "Localhost";
  if (badAppArmor(podSc.appArmorProfile)) fail("baseline", "appArmorProfile", `pod appArmorProfile ${podSc.appArmorProfile.type}`);
  each("baseline", "appArmorProfile", "appArmorProfile not RuntimeDefault or Localhost", (c, sc) => badAppArmor(sc.appArmorProfile));
  for (const [k, v] of Object.entries(meta.annotations ?? {})) {
    if (k.startsWith("container.apparmor.security.beta.kubernetes.io/") && v !== "runtime/default" && !String(v).startsWith("localhost/")) {
      fail("baseline", "appArmorProfile", `annotation ${k}=${v}`);
    }
  }
  const badSelinux = (o) => o != null && (!SELINUX_TYPES.has(o.type ?? "") || o.user != null || o.role != null);
  if (badSelinux(podSc.seLinuxOptions)) fail("baseline", "seLinuxOptions", "pod seLinuxOptions");
  each("baseline", "seLinuxOptions", "seLinuxOptions type, user or role", (c, sc) => badSelinux(sc.seLinuxOptions));
  each("baseline", "procMount", "procMount other than Default", (c, sc) => sc.procMount != null && sc.procMount !== "Default");
  if (podSc.seccompProfile?.type === "Unconfined") fail("baseline", "seccompProfile_baseline", "pod seccompProfile Unconfined");
  each("baseline", "seccompProfile_baseline", "seccompProfile Unconfined", (c, sc) => sc.seccompProfile?.type === "Unconfined");
  const unsafe = (podSc.sysctls ?? []).map((s) => s.name).filter((n) => !SAFE_SYSCTLS.has(n));
  if (unsafe.length) fail("baseline", "sysctls", `unsafe sysctls: ${unsafe.join(", ")}`);
  for (const { c } of containers) {
    const handlers = [["startupProbe", c.startupProbe], ["livenessProbe", c.livenessProbe],
      ["readinessProbe", c.readinessProbe], ["lifecycle.postStart", c.lifecycle?.postStart],
      ["lifecycle.preStop", c.lifecycle?.preStop]];
    for (const [where, h] of handlers) {
      if (h?.httpGet?.host || h?.tcpSocket?.host) fail("baseline", "hostProbesAndHostLifecycle", `${c.name} ${where} sets host`);
    }
  }

  // --- restricted ---
  for (const v of spec.volumes ?? []) {
    const type = Object.keys(v).find((k) => k !== "name");
    if (!RESTRICTED_VOLUMES.has(type)) fail("restricted", "restrictedVolumes", `volume ${v.name} is ${type}`);
  }
  each("restricted", "allowPrivilegeEscalation", "allowPrivilegeEscalation not false",
    (c, sc) => sc.allowPrivilegeEscalation !== false);
  const nonRootExplicitlyFalse = names((c, sc) => sc.runAsNonRoot === false);
  const nonRootUnset = names((c, sc) => sc.runAsNonRoot == null);
  if (podSc.runAsNonRoot === false || nonRootExplicitlyFalse.length
      || (podSc.runAsNonRoot !== true && nonRootUnset.length)) {
    fail("restricted", "runAsNonRoot", podSc.runAsNonRoot === false ? "pod runAsNonRoot=false"
      : nonRootExplicitlyFalse.length ? `runAsNonRoot=false: ${nonRootExplicitlyFalse.join(", ")}`
        : `runAsNonRoot unset for the pod and for ${nonRootUnset.join(", ")}`);
  }
  if (podSc.runAsUser === 0) fail("restricted", "runAsUser", "pod runAsUser=0");
  each("restricted", "runAsUser", "runAsUser=0", (c, sc) => sc.runAsUser === 0);
  const okSeccomp = (p) => p?.type === "RuntimeDefault" || p?.type === "Localhost";
  const seccompBad = names((c, sc) => sc.seccompProfile != null ? !okSeccomp(sc.seccompProfile) : !okSeccomp(podSc.seccompProfile));
  if ((podSc.seccompProfile != null && !okSeccomp(podSc.seccompProfile)) || seccompBad.length) {
    fail("restricted", "seccompProfile_restricted", `seccompProfile not RuntimeDefault or Localhost for ${
      seccompBad.length ? seccompBad.join(", ") : "the pod"}`);
  }
  for (const { c } of containers) {
    const caps = c.securityContext?.capabilities ?? {};
    if (!(caps.drop ?? []).includes("ALL")) fail("restricted", "capabilities_restricted", `${c.name} does not drop ALL`);
    const extra = (caps.add ?? []).filter((x) => x !== "NET_BIND_SERVICE");
    if (extra.length) fail("restricted", "capabilities_restricted", `${c.name} adds ${extra.join(", ")}`);
  }
  return found;
}

/** The violations that keep a pod from a level: for "restricted", those of both levels. */
export function violationsAt(found, level) {
  if (level === "privileged") return [];
  return found.filter((v) => v.level === "baseline" || level === "restricted");
}

/** The strictest level a pod passes. */
export function strictestLevel(found) {
  if (violationsAt(found, "restricted").length === 0) return "restricted";
  if (violationsAt(found, "baseline").length === 0) return "baseline";
  return "privileged";
}
