// Validates Kubernetes objects against the API schemas shipped in the npm
// package kubernetes-models (run from the fixture directory that holds
// node_modules):
//   node validate_k8s.mjs NODE_MODULES objects.json
// objects.json is a JSON array of objects (kubectl kustomize output). Each
// object is checked by the model class of its apiVersion and kind; an
// object whose kind has no model fails. Prints one line per object.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";

const [nodeModules, file] = process.argv.slice(2);
if (!nodeModules || !file) {
  console.error("usage: node validate_k8s.mjs NODE_MODULES objects.json");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const objects = JSON.parse(readFileSync(file, "utf8"));

let failures = 0;
for (const object of objects) {
  const { apiVersion, kind } = object;
  const name = `${kind}/${object.metadata?.name} (${apiVersion})`;
  let Model;
  try {
    // "apps/v1" -> kubernetes-models/apps/v1, "v1" -> kubernetes-models/v1.
    Model = require(`kubernetes-models/${apiVersion}/${kind}`)[kind];
  } catch (e) {
    console.log(`FAIL ${name}: no schema in kubernetes-models (${e.code || e.message})`);
    failures++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    const details = (e.errors || []).map(
      (err) => `  ${err.instancePath || "/"} ${err.message} ${JSON.stringify(err.params)}`);
    console.log(`FAIL ${name}: ${e.message}\n${details.join("\n")}`);
  }
}
console.log(`${objects.length - failures}/${objects.length} objects valid`);
process.exit(failures ? 1 : 0);
