// Checks the Kubernetes manifests, offline, run by .ci/deploy-checks.sh from the directory where
// its npm packages are installed (ES modules resolve from the script's location):
//   cp .ci/validate-k8s.mjs .ci/pod-security.mjs "$TOOLS/" && node "$TOOLS/validate-k8s.mjs" FILE...
//
// 1. The Kubernetes API's OpenAPI schemas, with the kubernetes-models package (schemas generated
//    from Kubernetes' OpenAPI spec: wrong types and missing required fields are errors).
// 2. The Pod Security Standards (pod-security.mjs: the baseline and restricted rules of the Pod
//    Security Admission controller). Every workload names its namespace, and a Namespace in the
//    files given labels it pod-security.kubernetes.io/enforce=LEVEL: the pod must pass LEVEL, and,
//    below restricted, fail the next stricter level (a label weaker than what the pod passes
//    claims less than is true). What keeps it from the next level is printed. The rules are
//    first run against pods made to break each one, so a check that stopped firing fails here.
// 3. gpumemd's own rules: no pod shares a PID namespace (hostPID, shareProcessNamespace: memory
//    crosses as file descriptors), and every gpumemd daemon container has httpGet probes on its
//    metrics port: startup and liveness on /healthz, readiness on /readyz, and no exec probes.
import fs from "node:fs";
import yaml from "js-yaml";
import * as apps from "kubernetes-models/apps/v1";
import * as core from "kubernetes-models/v1";
import { checkPod, containersOf, LEVELS, strictestLevel, violationsAt } from "./pod-security.mjs";

const groups = { "apps/v1": apps, v1: core };
const WORKLOADS = new Set(["Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "Pod"]);
const DAEMON_METRICS_PORT = 9464; // the daemon's --metrics-port default

let failed = 0;
const fail = (msg) => {
  failed++;
  console.error(`FAIL ${msg}`);
};

selfTest();

const docs = [];
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.loadAll(fs.readFileSync(file, "utf8"))) {
    if (doc != null) docs.push({ file, doc, name: `${file}: ${doc.kind}/${doc.metadata?.name}` });
  }
}

// 1. schemas
let valid = 0;
for (const { doc, name } of docs) {
  const Model = groups[doc.apiVersion]?.[doc.kind];
  if (!Model) {
    fail(`${name}: no schema for ${doc.apiVersion} ${doc.kind}`);
    continue;
  }
  try {
    new Model(doc).validate();
    valid++;
    console.log(`ok   ${name}: schema`);
  } catch (e) {
    fail(`${name}: ${e.message}`);
  }
}

// 2. and 3., per workload
const enforced = new Map();
for (const { doc } of docs) {
  if (doc.kind === "Namespace") {
    enforced.set(doc.metadata?.name, doc.metadata?.labels?.["pod-security.kubernetes.io/enforce"]);
  }
}
let workloads = 0;
for (const { doc, name } of docs) {
  if (!WORKLOADS.has(doc.kind)) continue;
  workloads++;
  const pod = doc.kind === "Pod" ? doc : doc.spec?.template ?? {};
  podSecurity(name, doc, pod);
  sharesNoPidNamespace(name, pod.spec ?? {});
  for (const { c } of containersOf(pod.spec ?? {})) {
    if (String(c.image).startsWith("gpumemd:") && c.command == null) httpProbes(`${name} container ${c.name}`, c);
  }
}
console.log(`${valid} manifest(s) valid against the schemas, ${workloads} workload(s) checked, ${failed} problem(s)`);
process.exit(failed === 0 && valid > 0 && workloads > 0 ? 0 : 1);

function podSecurity(name, doc, pod) {
  const ns = doc.metadata?.namespace;
  const level = enforced.get(ns);
  if (!LEVELS.includes(level)) {
    fail(`${name}: its namespace (${ns ?? "none given"}) is not a Namespace here labelled `
      + `pod-security.kubernetes.io/enforce with one of ${LEVELS.join(", ")}`);
    return;
  }
  const found = checkPod(pod);
  const blocking = violationsAt(found, level);
  if (blocking.length > 0) {
    fail(`${name}: namespace ${ns} enforces ${level}, which the pod fails: ${describe(blocking)}`);
    return;
  }
  const best = strictestLevel(found);
  if (best !== level) {
    fail(`${name}: labelled ${level} but passes ${best}: label namespace ${ns} ${best}`);
    return;
  }
  const stricter = LEVELS.slice(LEVELS.indexOf(level) + 1);
  const why = stricter.map((l) => `not ${l}: ${describe(found.filter((v) => v.level === l))}`);
  console.log(`ok   ${name}: passes Pod Security ${level}` + (why.length ? ` (${why.join("; ")})` : ""));
}

function describe(violations) {
  return violations.map((v) => `${v.check} (${v.detail})`).join("; ");
}

function sharesNoPidNamespace(name, spec) {
  for (const f of ["hostPID", "shareProcessNamespace"]) {
    if (spec[f] === true) fail(`${name}: ${f}: true (memory crosses as file descriptors; legacy handles are documented in deploy/README.md)`);
  }
}

/** Startup and liveness on /healthz, readiness on /readyz, all httpGet on the metrics port. */
function httpProbes(name, c) {
  const before = failed;
  const metrics = (c.ports ?? []).find((p) => p.name === "metrics");
  if (metrics == null) {
    fail(`${name}: no containerPort named metrics`);
    return;
  }
  const args = c.args ?? [];
  const flag = args.lastIndexOf("--metrics-port");
  const daemonPort = flag >= 0 ? Number(args[flag + 1]) : DAEMON_METRICS_PORT;
  if (metrics.containerPort !== daemonPort) {
    fail(`${name}: containerPort metrics is ${metrics.containerPort}, the daemon serves ${daemonPort}`);
  }
  const wanted = { startupProbe: "/healthz", livenessProbe: "/healthz", readinessProbe: "/readyz" };
  for (const [probe, path] of Object.entries(wanted)) {
    const p = c[probe];
    if (p?.httpGet == null || p.exec != null || p.grpc != null || p.tcpSocket != null) {
      fail(`${name}: ${probe} is not an httpGet probe: ${JSON.stringify(p)}`);
      continue;
    }
    const port = p.httpGet.port;
    const onMetrics = port === "metrics" || port === metrics.containerPort;
    if (p.httpGet.path !== path || !onMetrics || (p.httpGet.scheme ?? "HTTP") !== "HTTP") {
      fail(`${name}: ${probe} asks ${p.httpGet.scheme ?? "HTTP"} ${port} ${p.httpGet.path} (expected: HTTP ${path} on the metrics port)`);
    }
  }
  if (failed === before) console.log(`ok   ${name}: httpGet probes /healthz and /readyz on the metrics port`);
}

/** Each rule must fire on a pod made to break it, and a pod that breaks none must pass restricted. */
function selfTest() {
  const good = () => ({
    metadata: {},
    spec: {
      securityContext: { runAsNonRoot: true, runAsUser: 1000, seccompProfile: { type: "RuntimeDefault" } },
      containers: [{ name: "c", securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ["ALL"] } } }],
      volumes: [{ name: "v", emptyDir: {} }],
    },
  });
  const cases = [
    ["hostNamespaces", (p) => { p.spec.hostPID = true; }],
    ["hostNamespaces", (p) => { p.spec.hostIPC = true; }],
    ["hostNamespaces", (p) => { p.spec.hostNetwork = true; }],
    ["privileged", (p) => { p.spec.containers[0].securityContext.privileged = true; }],
    ["capabilities_baseline", (p) => { p.spec.containers[0].securityContext.capabilities.add = ["SYS_ADMIN"]; }],
    ["hostPathVolumes", (p) => { p.spec.volumes.push({ name: "h", hostPath: { path: "/run" } }); }],
    ["hostPorts", (p) => { p.spec.containers[0].ports = [{ containerPort: 1, hostPort: 1 }]; }],
    ["appArmorProfile", (p) => { p.spec.securityContext.appArmorProfile = { type: "Unconfined" }; }],
    ["seLinuxOptions", (p) => { p.spec.containers[0].securityContext.seLinuxOptions = { type: "spc_t" }; }],
    ["procMount", (p) => { p.spec.containers[0].securityContext.procMount = "Unmasked"; }],
    ["seccompProfile_baseline", (p) => { p.spec.containers[0].securityContext.seccompProfile = { type: "Unconfined" }; }],
    ["sysctls", (p) => { p.spec.securityContext.sysctls = [{ name: "kernel.msgmax", value: "1" }]; }],
    ["hostProbesAndHostLifecycle", (p) => { p.spec.containers[0].livenessProbe = { httpGet: { host: "10.0.0.1", port: 1 } }; }],
    ["hostProcess", (p) => { p.spec.securityContext.windowsOptions = { hostProcess: true }; }],
    ["restrictedVolumes", (p) => { p.spec.volumes.push({ name: "n", nfs: { server: "s", path: "/" } }); }],
    ["allowPrivilegeEscalation", (p) => { delete p.spec.containers[0].securityContext.allowPrivilegeEscalation; }],
    ["runAsNonRoot", (p) => { delete p.spec.securityContext.runAsNonRoot; }],
    ["runAsNonRoot", (p) => { p.spec.containers[0].securityContext.runAsNonRoot = false; }],
    ["runAsUser", (p) => { p.spec.containers[0].securityContext.runAsUser = 0; }],
    ["seccompProfile_restricted", (p) => { delete p.spec.securityContext.seccompProfile; }],
    ["capabilities_restricted", (p) => { p.spec.containers[0].securityContext.capabilities = {}; }],
    ["capabilities_restricted", (p) => { p.spec.containers[0].securityContext.capabilities.add = ["CHOWN"]; }],
  ];
  const clean = checkPod(good());
  if (clean.length > 0) fail(`self-test: a pod that breaks no rule is flagged: ${describe(clean)}`);
  let fired = 0;
  for (const [check, breakIt] of cases) {
    const pod = good();
    breakIt(pod);
    if (checkPod(pod).some((v) => v.check === check)) fired++;
    else fail(`self-test: ${check} did not fire on ${JSON.stringify(pod.spec)}`);
  }
  console.log(`ok   Pod Security self-test: ${fired} of ${cases.length} broken pods caught, the clean one passes restricted`);
}
