#!/usr/bin/env node
// Validates Kubernetes manifests offline, without a cluster:
//  1. every object against Kubernetes' own API schema for its apiVersion/kind: the JSON schemas that
//     kubernetes-models (npm) generates from the Kubernetes OpenAPI spec (types, required fields, enums,
//     formats), run with ajv;
//  2. strictly: a field the schema does not know (a typo such as `completionMod`) is an error, as it is for
//     `kubectl apply --validate=strict` against a server. Found by recording which fields the schema
//     validator reads: any field of the manifest it never looked at is unknown to the schema;
//  3. dtrain's own rules for a cluster of Indexed Jobs behind a headless Service (see dtrain-cluster.yaml): every
//     TF_CONFIG is valid JSON naming the same cluster, and that cluster lists exactly the pods the Jobs make
//     (<job>-<index>.<subdomain>:<port> for every completion index), the Service is headless and selects the
//     pods, and JOB_COMPLETION_INDEX is defined before TF_CONFIG uses it.
//
//   node deploy/kubernetes/validate/validate.mjs FILE.yaml...
// Prints "FILE: ok (...)" per valid file, or one line per problem naming the file, object and field; exits 0 if
// every file is valid, 1 if any is not, 2 on bad usage or an unreadable file.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

function track(value, path, seen) {
  if (value === null || typeof value !== "object") return value;
  return new Proxy(value, {
    get(target, key, receiver) {
      const v = Reflect.get(target, key, receiver);
      if (typeof key !== "string") return v;
      const p = `${path}/${key}`;
      seen.add(p);
      return track(v, p, seen);
    },
  });
}

function unknownFields(value, path, seen, out) {
  if (value === null || typeof value !== "object") return;
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, `${path}/${i}`, seen, out));
    return;
  }
  for (const key of Object.keys(value)) {
    const p = `${path}/${key}`;
    if (!seen.has(p)) out.push(p);
    else unknownFields(value[key], p, seen, out);
  }
}

const dotted = (p) => p.replace(/^\//, "").replace(/\/(\d+)(?=\/|$)/g, "[$1]").replace(/\//g, ".");

async function schemaProblems(doc) {
  const { apiVersion, kind } = doc;
  if (typeof apiVersion !== "string" || typeof kind !== "string") return ["needs apiVersion and kind strings"];
  let mod;
  try {
    mod = await import(`kubernetes-models/${apiVersion}`);
  } catch {
    return [`unknown apiVersion "${apiVersion}"`];
  }
  const Model = mod[kind];
  if (typeof Model !== "function" || typeof Model.prototype.validate !== "function") {
    return [`unknown kind "${kind}" in ${apiVersion}`];
  }
  const seen = new Set();
  try {
    Model.prototype.validate.call(track(doc, "", seen));
  } catch (e) {
    return e.message.split(", ").map((m) => m.replace(/^data\//, "").replace(/^data /, "").replace(/\//g, "."));
  }
  const unknown = [];
  unknownFields(doc, "", seen, unknown);
  return unknown.map((p) => `${dotted(p)}: unknown field (not in the ${apiVersion} ${kind} schema)`);
}

function dtrainProblems(docs) {
  const problems = [];
  const services = new Map(docs.filter((d) => d.kind === "Service").map((d) => [d.metadata?.name, d]));
  const jobs = docs.filter((d) => d.kind === "Job" && d.apiVersion === "batch/v1");
  let clusterText = null;
  for (const job of jobs) {
    const name = job.metadata?.name;
    const spec = job.spec ?? {};
    const pod = spec.template?.spec ?? {};
    for (const c of pod.containers ?? []) {
      const env = c.env ?? [];
      const at = env.findIndex((e) => e.name === "TF_CONFIG");
      if (at < 0) continue;
      const where = `Job ${name}, container ${c.name}`;
      const raw = env[at].value ?? "";
      if (raw.includes("$(JOB_COMPLETION_INDEX)")) {
        const def = env.findIndex((e) => e.name === "JOB_COMPLETION_INDEX");
        if (def < 0 || def > at) problems.push(`${where}: JOB_COMPLETION_INDEX must be defined before TF_CONFIG`);
        if (spec.completionMode !== "Indexed") problems.push(`${where}: TF_CONFIG uses the completion index but the Job is not Indexed`);
      }
      let tf;
      try {
        tf = JSON.parse(raw.replaceAll("$(JOB_COMPLETION_INDEX)", "0"));
      } catch (e) {
        problems.push(`${where}: TF_CONFIG is not valid JSON: ${e.message}`);
        continue;
      }
      const cluster = tf.cluster ?? {};
      const text = JSON.stringify(cluster);
      if (clusterText === null) clusterText = text;
      else if (text !== clusterText) problems.push(`${where}: TF_CONFIG names another cluster than the first Job's`);
      const type = tf.task?.type;
      if (!Array.isArray(cluster[type])) {
        problems.push(`${where}: TF_CONFIG task type "${type}" is not a job of its cluster`);
        continue;
      }
      const service = services.get(pod.subdomain);
      if (!service) {
        problems.push(`${where}: subdomain "${pod.subdomain}" names no Service in this file`);
        continue;
      }
      if (service.spec?.clusterIP !== "None") problems.push(`Service ${pod.subdomain}: must be headless (clusterIP: None)`);
      const labels = spec.template?.metadata?.labels ?? {};
      for (const [k, v] of Object.entries(service.spec?.selector ?? {})) {
        if (labels[k] !== v) problems.push(`${where}: pod labels do not match Service ${pod.subdomain}'s selector ${k}=${v}`);
      }
      const ports = (service.spec?.ports ?? []).map((p) => p.port);
      const n = spec.completions ?? 1;
      if ((spec.parallelism ?? 1) !== n) problems.push(`${where}: parallelism must equal completions (${n}): every task runs at once`);
      const expected = [...Array(n).keys()].map((i) => `${name}-${i}.${pod.subdomain}:${ports[0]}`);
      if (JSON.stringify(cluster[type]) !== JSON.stringify(expected)) {
        problems.push(`${where}: TF_CONFIG lists ${type} tasks ${JSON.stringify(cluster[type])} but the Job makes ` +
                      `${JSON.stringify(expected)}`);
      }
    }
  }
  return [...new Set(problems)];
}

async function validateFile(file) {
  let text;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    console.error(`${file}: cannot read: ${e.message}`);
    process.exit(2);
  }
  const problems = [];
  const docs = [];
  parseAllDocuments(text).forEach((d, i) => {
    if (d.errors?.length) {
      problems.push(`document ${i + 1}: YAML error: ${d.errors[0].message.split("\n")[0]}`);
      return;
    }
    const obj = d.toJS();
    if (obj !== null && obj !== undefined) docs.push(obj);
  });
  for (const [i, doc] of docs.entries()) {
    const what = `document ${i + 1} (${doc?.kind ?? "?"} ${doc?.metadata?.name ?? "?"})`;
    for (const p of await schemaProblems(doc)) problems.push(`${what}: ${p}`);
  }
  if (problems.length === 0) problems.push(...dtrainProblems(docs));
  if (docs.length === 0 && problems.length === 0) problems.push("no Kubernetes objects in the file");
  for (const p of problems) console.log(`${file}: ${p}`);
  if (problems.length === 0) {
    console.log(`${file}: ok (${docs.map((d) => `${d.kind}/${d.metadata?.name}`).join(", ")})`);
  }
  return problems.length === 0;
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: validate.mjs FILE.yaml...");
  process.exit(2);
}
let ok = true;
for (const f of files) ok = (await validateFile(f)) && ok;
process.exit(ok ? 0 : 1);
