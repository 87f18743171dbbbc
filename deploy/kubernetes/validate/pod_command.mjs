#!/usr/bin/env node
// What one pod of a manifest's Indexed Job runs: its container's command and args, then every environment
// variable as NAME=VALUE, with JOB_COMPLETION_INDEX (the downward API's completion index) set to INDEX and
// $(VAR) references expanded as the kubelet does. Each item ends with a NUL byte, for `mapfile -d ''`:
//
//   node deploy/kubernetes/validate/pod_command.mjs FILE.yaml JOB INDEX [CONTAINER]
//
// (argv items first, then "--env", then NAME=VALUE items.) tests/kubernetes_manifests_test.sh runs the pods of
// deploy/kubernetes/dtrain-elastic.yaml this way on 127.0.0.1. Exits 2 with a message if the Job or container
// is not in the file.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const [file, jobName, index, containerName] = process.argv.slice(2);
if (!file || !jobName || !/^[0-9]+$/.test(index ?? "")) {
  console.error("usage: pod_command.mjs FILE.yaml JOB INDEX [CONTAINER]");
  process.exit(2);
}
const docs = parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS());
const job = docs.find((d) => d?.kind === "Job" && d.metadata?.name === jobName);
if (!job) {
  console.error(`pod_command: no Job ${jobName} in ${file}`);
  process.exit(2);
}
const containers = job.spec?.template?.spec?.containers ?? [];
const c = containerName ? containers.find((x) => x.name === containerName) : containers[0];
if (!c) {
  console.error(`pod_command: Job ${jobName} has no container ${containerName ?? ""}`);
  process.exit(2);
}
const COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']";
const env = new Map();
// $(VAR) of a variable defined earlier is replaced; $$(VAR) is a literal $(VAR); anything else stays.
const expand = (s) => s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g,
                                (m, name) => (m === "$$" ? "$" : env.has(name) ? env.get(name) : m));
for (const e of c.env ?? []) {
  if (e.valueFrom?.fieldRef?.fieldPath === COMPLETION_INDEX) env.set(e.name, index);
  else if (e.value !== undefined) env.set(e.name, expand(String(e.value)));
}
const out = [...[...(c.command ?? []), ...(c.args ?? [])].map((a) => expand(String(a))), "--env",
             ...[...env].map(([k, v]) => `${k}=${v}`)];
process.stdout.write(out.map((s) => `${s}\0`).join(""));
