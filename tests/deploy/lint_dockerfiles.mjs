// Lints Dockerfiles with the npm package dockerfile-utils (the validator of
// the Dockerfile language server):
//   node lint_dockerfiles.mjs NODE_MODULES Dockerfile...
// Every diagnostic (error, warning, information, hint) fails the run.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";

const [nodeModules, ...files] = process.argv.slice(2);
if (!nodeModules || files.length === 0) {
  console.error("usage: node lint_dockerfiles.mjs NODE_MODULES Dockerfile...");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const { validate, ValidationSeverity } = require("dockerfile-utils");

// Problems the linter can report are errors unless set otherwise; make the
// optional checks strict too.
const settings = {
  deprecatedMaintainer: ValidationSeverity.ERROR,
  directiveCasing: ValidationSeverity.ERROR,
  emptyContinuationLine: ValidationSeverity.ERROR,
  instructionCasing: ValidationSeverity.ERROR,
  instructionCmdMultiple: ValidationSeverity.ERROR,
  instructionEntrypointMultiple: ValidationSeverity.ERROR,
  instructionHealthcheckMultiple: ValidationSeverity.ERROR,
  instructionJSONInSingleQuotes: ValidationSeverity.ERROR,
  instructionWorkdirRelative: ValidationSeverity.ERROR,
};
const names = ["", "error", "warning", "information", "hint"];

let failures = 0;
for (const file of files) {
  const text = readFileSync(file, "utf8");
  const diagnostics = validate(text, settings);
  for (const d of diagnostics) {
    failures++;
    const line = d.range.start.line + 1;
    console.log(`${file}:${line}: ${names[d.severity] || d.severity}: ${d.message}`);
  }
  console.log(`${diagnostics.length ? "FAIL" : "ok  "} ${file} (${diagnostics.length} diagnostics)`);
}
process.exit(failures ? 1 : 0);
