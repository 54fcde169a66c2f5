// Validates Kubernetes manifests against the API's OpenAPI schemas, offline, with the
// kubernetes-models package (schemas generated from Kubernetes' OpenAPI spec: unknown fields,
// wrong types and missing required fields are errors). Run by .ci/deploy-checks.sh from the
// directory where that package is installed (ES modules resolve from the script's location):
//   cp .ci/validate-k8s.mjs "$TOOLS/" && node "$TOOLS/validate-k8s.mjs" FILE...
import fs from "node:fs";
import yaml from "js-yaml";
import * as apps from "kubernetes-models/apps/v1";
import * as core from "kubernetes-models/v1";

const groups = { "apps/v1": apps, v1: core };

let failed = 0;
let checked = 0;
for (const file of process.argv.slice(2)) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d != null);
  for (const doc of docs) {
    const name = `${file}: ${doc.kind}/${doc.metadata?.name}`;
    const Model = groups[doc.apiVersion]?.[doc.kind];
    if (!Model) {
      console.error(`FAIL ${name}: no schema for ${doc.apiVersion} ${doc.kind}`);
      failed++;
      continue;
    }
    try {
      new Model(doc).validate();
      checked++;
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.error(`FAIL ${name}: ${e.message}`);
    }
  }
}
console.log(`${checked} manifest(s) valid, ${failed} invalid`);
process.exit(failed === 0 && checked > 0 ? 0 : 1);
