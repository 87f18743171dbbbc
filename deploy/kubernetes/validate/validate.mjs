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
//     pods, and JOB_COMPLETION_INDEX is defined before TF_CONFIG uses it. The chief and the workers run the
//     same dtrain_worker flags (the ps refuses a worker whose training config differs), and a worker pod's
//     terminationGracePeriodSeconds exceeds its --stop_grace_secs (default 10): SIGTERM lets the step in
//     flight finish, then the worker leaves, before Kubernetes' SIGKILL;
//  4. for an elastic job (dtrain-elastic.yaml: dtrain_ps --max_workers=M, a worker Job scaled while it runs, see
//     docs/elastic_schedulers.md): every ps task has the same M; every worker and the chief run
//     --elastic_batch=per_worker or global (the same flags, so the same one); the chief is a TF_CONFIG "chief" task of its own Job,
//     so no scale-down removes it; the scaled worker Job declares how far it may grow in the annotation
//     dtrain/max-completions, which covers its completions, and the chief plus that many workers fit in M; its
//     completions equal its parallelism (only then may Kubernetes change them) and it sets
//     backoffLimitPerIndex, so a failed worker fails its own index and not the Job (which would stop every
//     worker).
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
  problems.push(...workerProblems(jobs));
  return [...new Set(problems)];
}

// The value of flag --NAME in argv (`--NAME=V` or `--NAME V`; the last one wins, as for absl flags), or undefined.
function flagValue(argv, name) {
  let value;
  argv.forEach((a, i) => {
    if (a.startsWith(`--${name}=`)) value = a.slice(name.length + 3);
    else if (a === `--${name}` && i + 1 < argv.length) value = argv[i + 1];
  });
  return value;
}

const MAX_COMPLETIONS = "dtrain/max-completions";

// Every container of the Jobs with a TF_CONFIG: {job, spec, pod, c, argv, type, cluster} (TF_CONFIG parsed with
// index 0; the ones that do not parse were reported already).
function tasks(jobs) {
  const out = [];
  for (const job of jobs) {
    const spec = job.spec ?? {};
    const pod = spec.template?.spec ?? {};
    for (const c of pod.containers ?? []) {
      const tfEnv = (c.env ?? []).find((e) => e.name === "TF_CONFIG");
      if (!tfEnv) continue;
      let tf;
      try {
        tf = JSON.parse((tfEnv.value ?? "").replaceAll("$(JOB_COMPLETION_INDEX)", "0"));
      } catch {
        continue;
      }
      out.push({ job, spec, pod, c, argv: [...(c.command ?? []), ...(c.args ?? [])], type: tf.task?.type,
                 cluster: tf.cluster ?? {}, where: `Job ${job.metadata?.name}, container ${c.name}` });
    }
  }
  return out;
}

function workerProblems(jobs) {
  const problems = [];
  const all = tasks(jobs);
  const workers = all.filter((t) => t.type === "worker" || t.type === "chief");
  const ps = all.filter((t) => t.type === "ps");
  // The same flags for every worker.
  for (const w of workers.slice(1)) {
    if (JSON.stringify(w.argv) !== JSON.stringify(workers[0].argv)) {
      problems.push(`${w.where}: runs ${JSON.stringify(w.argv)} but ${workers[0].where} runs ` +
                    `${JSON.stringify(workers[0].argv)}: every worker needs the same flags`);
    }
  }
  // Time for a graceful stop.
  for (const w of workers) {
    const raw = flagValue(w.argv, "stop_grace_secs");
    const grace = raw === undefined ? 10 : Number(raw);
    const period = w.pod.terminationGracePeriodSeconds ?? 30;
    if (!(period > grace)) {
      problems.push(`${w.where}: terminationGracePeriodSeconds ${period} must exceed --stop_grace_secs (${grace}): ` +
                    `SIGTERM lets the step in flight finish, then the worker leaves, before the SIGKILL`);
    }
  }
  // Elastic jobs.
  const maxes = ps.map((t) => flagValue(t.argv, "max_workers"));
  const scaled = jobs.filter((j) => j.metadata?.annotations?.[MAX_COMPLETIONS] !== undefined);
  const elastic = maxes.some((m) => m !== undefined) || scaled.length > 0 ||
                  workers.some((w) => flagValue(w.argv, "elastic_batch") !== undefined);
  if (!elastic) return problems;
  for (const w of workers) {
    const batch = flagValue(w.argv, "elastic_batch");
    if (batch === undefined) {
      problems.push(`${w.where}: an elastic job (workers join and leave) needs --elastic_batch=per_worker (or ` +
                    `global) on every worker`);
    } else if (batch !== "per_worker" && batch !== "global") {
      problems.push(`${w.where}: --elastic_batch=${batch}: per_worker or global`);
    }
  }
  if (ps.length === 0) return problems;
  if (maxes.some((m) => m === undefined)) {
    problems.push(`${ps.find((t, i) => maxes[i] === undefined).where}: an elastic job needs dtrain_ps ` +
                  `--max_workers=M on every ps task (workers past the spec's join only up to M - 1)`);
    return problems;
  }
  if (new Set(maxes).size > 1) {
    problems.push(`the ps tasks disagree on --max_workers (${[...new Set(maxes)].join(", ")}): give every ps task the same M`);
    return problems;
  }
  const m = Number(maxes[0]);
  const cluster = ps[0].cluster;
  const chiefs = (cluster.chief ?? []).length;
  const listed = chiefs + (cluster.worker ?? []).length;
  if (!Number.isInteger(m) || m < listed) {
    problems.push(`${ps[0].where}: --max_workers=${maxes[0]} must be an integer at least the ${listed} workers ` +
                  `TF_CONFIG lists (the chief included)`);
    return problems;
  }
  if (chiefs === 0) {
    problems.push(`an elastic job needs the chief as a TF_CONFIG "chief" task in a Job of its own: as worker 0 of ` +
                  `the scaled worker Job, a scale-down to 0 would stop it, and with it the run`);
  }
  const workerJobs = [...new Set(workers.filter((w) => w.type === "worker").map((w) => w.job))];
  for (const job of workerJobs) {
    const name = job.metadata?.name;
    const spec = job.spec ?? {};
    const raw = job.metadata?.annotations?.[MAX_COMPLETIONS];
    if (raw === undefined) {
      problems.push(`Job ${name}: an elastic worker Job needs the annotation ${MAX_COMPLETIONS}: "N", how far it ` +
                    `may be scaled (the chief plus N workers must fit in --max_workers=${m})`);
      continue;
    }
    const n = Number(raw);
    if (!/^[0-9]+$/.test(raw) || n < (spec.completions ?? 1)) {
      problems.push(`Job ${name}: annotation ${MAX_COMPLETIONS} "${raw}" must be an integer at least its ` +
                    `completions (${spec.completions ?? 1})`);
    } else if (chiefs + n > m) {
      problems.push(`Job ${name}: scaled to ${MAX_COMPLETIONS} ${n}, it runs ${chiefs + n} workers with the chief, ` +
                    `more than dtrain_ps --max_workers=${m}: the pods past it would be refused (exit 2)`);
    }
    if (spec.backoffLimitPerIndex === undefined) {
      problems.push(`Job ${name}: an elastic worker Job needs backoffLimitPerIndex (e.g. 0): then a failed worker ` +
                    `fails its own index, not the Job, whose failure would stop every worker`);
    }
  }
  for (const job of scaled.filter((j) => !workerJobs.includes(j))) {
    problems.push(`Job ${job.metadata?.name}: annotation ${MAX_COMPLETIONS} on a Job that runs no TF_CONFIG workers ` +
                  `(the ps and the chief cannot be scaled)`);
  }
  return problems;
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
