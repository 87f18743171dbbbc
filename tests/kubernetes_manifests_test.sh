#!/usr/bin/env bash
# deploy/kubernetes/*.yaml validate offline against Kubernetes' API schemas and dtrain's TF_CONFIG rules
# (deploy/kubernetes/validate/validate.mjs; no cluster needed). Broken copies of the manifest must fail, each
# with a message naming what is wrong: a misspelt field, a wrong type, a bad enum value, a missing required
# field, a TF_CONFIG that lists more workers than the Job runs, and invalid TF_CONFIG JSON. Broken copies of the
# elastic manifest (dtrain-elastic.yaml) must fail on dtrain's elastic rules: a worker without
# --elastic_batch, an --elastic_batch that is neither per_worker nor global (global passes), workers whose flags differ, a ps without --max_workers or
# one too small for the declared scale, a scale annotation below the start or missing, no backoffLimitPerIndex,
# the chief inside the scaled worker Job, a grace period shorter than --stop_grace_secs.
# Then the elastic manifest's own pods run on 127.0.0.1 (their command and TF_CONFIG as Kubernetes would give
# them, read by deploy/kubernetes/validate/pod_command.mjs; the ps's address and the model made local and
# small): the ps, the chief and workers 0-1 train; the pod of the highest index the annotation allows joins (a
# scale-up), dtrain_ctl status run with the chief pod's environment lists it active, and it leaves on SIGTERM (a
# scale-down) with exit 143; the pod one index further is refused, exit 2 naming --max_workers; the run ends
# complete (exit 0 everywhere) naming the worker that left. Skipped without the built binaries or the data set
# (that part only).
# Skips (77) where Node.js or the validator's npm packages are missing (scripts/install_deps.sh installs both);
# with DTRAIN_REQUIRE_DEPS=1 (scripts/test.sh) that fails instead.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
V="$ROOT/deploy/kubernetes/validate"
source "$(dirname "$0")/skipping.sh"
command -v node >/dev/null || skip "no node (scripts/install_deps.sh installs nodejs)"
[ -d "$V/node_modules/kubernetes-models" ] ||
  skip "validator packages not installed (scripts/install_deps.sh runs npm ci in $V)"
dir="$(mktemp -d /tmp/dtrain_k8s_test.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
passed=0; failed=0

rc=0; out="$(node "$V/validate.mjs" "$ROOT"/deploy/kubernetes/*.yaml 2>&1)" || rc=$?
echo "$out"
if [ "$rc" = 0 ] && grep -q "dtrain-cluster.yaml: ok (Service/dtrain, Job/dtrain-ps, Job/dtrain-worker)" <<<"$out" &&
   grep -q "dtrain-elastic.yaml: ok (Service/dtrain, Job/dtrain-ps, Job/dtrain-chief, Job/dtrain-worker)" <<<"$out"; then
  passed=$((passed + 1))
else
  echo "FAIL: the shipped manifests do not validate (exit $rc)"; failed=$((failed + 1))
fi

# broken NAME SED-EXPRESSION EXPECTED-MESSAGE: a copy changed by sed must fail with that message.
# (MANIFEST: the file copied, dtrain-cluster.yaml unless set.)
broken() {
  local src="$ROOT/deploy/kubernetes/${MANIFEST:-dtrain-cluster.yaml}" f="$dir/$1.yaml" rc=0 out
  sed "$2" "$src" >"$f"
  if cmp -s "$f" "$src"; then
    echo "FAIL: $1: the sed expression changed nothing"; failed=$((failed + 1)); return
  fi
  out="$(node "$V/validate.mjs" "$f" 2>&1)" || rc=$?
  echo "$out"
  if [ "$rc" = 1 ] && grep -qF -- "$3" <<<"$out"; then
    passed=$((passed + 1))
  else
    echo "FAIL: $1: expected exit 1 and '$3', got exit $rc"; failed=$((failed + 1))
  fi
}
broken misspelt_field 's/completionMode: Indexed/completionMod: Indexed/' \
  "document 3 (Job dtrain-worker): spec.completionMod: unknown field (not in the batch/v1 Job schema)"
broken wrong_type 's/completions: 2/completions: "two"/' "spec.completions must be integer"
broken bad_enum 's/restartPolicy: Never/restartPolicy: Sometimes/' \
  "spec.template.spec.restartPolicy must be equal to one of the allowed values"
broken missing_required '/- {name: grpc, port: 2222, targetPort: 2222}/s/port: 2222, //' \
  "spec.ports.0 must have required property port"
broken bad_quantity 's/memory: 2Gi/memory: lots/' "resources.requests.memory must match format \"quantity\""
broken too_many_workers 's/"dtrain-worker-1.dtrain:2222"\]/"dtrain-worker-1.dtrain:2222", "dtrain-worker-2.dtrain:2222"]/' \
  "TF_CONFIG lists worker tasks"
broken bad_json 's/"task": {"type": "worker"/"task": {"type": worker/' "TF_CONFIG is not valid JSON"
broken not_headless 's/clusterIP: None/clusterIP: 10.96.0.10/' "must be headless"
broken grace_below_stop_grace 's/"--logdir=\/logs"\]/"--logdir=\/logs", "--stop_grace_secs=150"]/' \
  "terminationGracePeriodSeconds 120 must exceed --stop_grace_secs (150)"

# The elastic manifest: each of dtrain's elastic rules, broken once.
MANIFEST=dtrain-elastic.yaml
broken no_elastic_batch 's/ "--elastic_batch=per_worker",//' \
  "needs --elastic_batch=per_worker (or global) on every worker"
broken bad_elastic_batch 's/--elastic_batch=per_worker/--elastic_batch=per_step/' "--elastic_batch=per_step: per_worker or global"
# --elastic_batch=global (a fixed global batch) is an elastic job's other mode: accepted.
sed 's/--elastic_batch=per_worker/--elastic_batch=global/' "$ROOT/deploy/kubernetes/dtrain-elastic.yaml" >"$dir/global.yaml"
rc=0; out="$(node "$V/validate.mjs" "$dir/global.yaml" 2>&1)" || rc=$?
if [ "$rc" = 0 ] && ! cmp -s "$dir/global.yaml" "$ROOT/deploy/kubernetes/dtrain-elastic.yaml"; then
  passed=$((passed + 1))
else
  echo "$out"; echo "FAIL: the elastic manifest with --elastic_batch=global does not validate (exit $rc)"; failed=$((failed + 1))
fi
broken workers_differ '/name: dtrain-worker$/,$s/--train_steps=2000/--train_steps=3000/' "every worker needs the same flags"
broken no_max_workers 's/, "--max_workers=8"//' "needs dtrain_ps --max_workers=M on every ps task"
broken max_workers_below_spec 's/--max_workers=8/--max_workers=2/' \
  "--max_workers=2 must be an integer at least the 3 workers TF_CONFIG lists"
broken max_workers_below_scale 's/--max_workers=8/--max_workers=7/' \
  "scaled to dtrain/max-completions 7, it runs 8 workers with the chief, more than dtrain_ps --max_workers=7"
broken no_scale_annotation '/dtrain\/max-completions:/d' "needs the annotation dtrain/max-completions"
broken scale_below_start 's/dtrain\/max-completions: "7"/dtrain\/max-completions: "1"/' \
  "annotation dtrain/max-completions \"1\" must be an integer at least its completions (2)"
broken no_backoff_per_index '/backoffLimitPerIndex/d' "needs backoffLimitPerIndex"
broken short_grace 's/terminationGracePeriodSeconds: 60 /terminationGracePeriodSeconds: 30 /' \
  "Job dtrain-worker, container worker: terminationGracePeriodSeconds 30 must exceed --stop_grace_secs (30)"
# The chief as worker 0 of the scaled Job (its own Job and the "chief" entries gone): refused.
broken chief_in_scaled_job \
  '/^---$/{N;N;N;N;/name: dtrain-chief$/{:a;N;/\n---$/!ba;s/.*\n//};}; s/"chief": \["dtrain-chief-0.dtrain:2222"\], //' \
  "needs the chief as a TF_CONFIG \"chief\" task in a Job of its own"
unset MANIFEST

# The elastic manifest's pods, run on 127.0.0.1.
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
if [ ! -x "$B/dtrain_ps" ] || [ ! -x "$B/dtrain_worker" ]; then
  echo "SKIP (this part): $B/dtrain_ps and dtrain_worker are not built"
elif [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP (this part): dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
else
  source "$ROOT/tests/checks.sh"
  bg=()
  trap 'for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT
  IFS=, read -r port <<<"$(python3 "$ROOT/scripts/free_ports.py" 1)"
  # pod JOB INDEX LOG [FLAGS...]: starts in the background what that pod runs, with TF_CONFIG's ps at
  # 127.0.0.1:$port, the binaries from $B, and FLAGS appended (the last value of a flag wins); sets $pid, and
  # $envs to the pod's environment.
  pod() {
    local job="$1" index="$2" log="$3" items argv=() seen_env=0 i
    envs=()
    shift 3
    mapfile -d '' items < <(node "$V/pod_command.mjs" "$ROOT/deploy/kubernetes/dtrain-elastic.yaml" "$job" "$index")
    for i in "${items[@]}"; do
      if [ "$i" = --env ]; then seen_env=1
      elif [ "$seen_env" = 1 ]; then envs+=("${i//dtrain-ps-0.dtrain:2222/127.0.0.1:$port}")
      else argv+=("${i/#\/opt\/dtrain\/bin\//$B/}")
      fi
    done
    echo "pod $job-$index: ${envs[*]} ${argv[*]} $*" >"$dir/$log"
    env "${envs[@]}" "${argv[@]}" "$@" >>"$dir/$log" 2>&1 &
    pid=$!; bg+=("$pid")
  }
  # Small and local: the mlp, one thread each, logs and checkpoints in $dir.
  Wf=(--model=mlp --train_steps=1500 --threads=1 --log_every=50 --startup_wait_secs=60 --rpc_timeout_secs=30)
  pod dtrain-ps 0 ps.log --listen_address=127.0.0.1:$port --checkpoint_dir="$dir/ckpt" --worker_timeout_secs=10
  ps_pid=$pid
  pod dtrain-chief 0 chief.log "${Wf[@]}" --logdir="$dir/logs-chief"; chief=$pid; chief_env=("${envs[@]}")
  pod dtrain-worker 0 w0.log "${Wf[@]}" --logdir="$dir/logs-w0"; w0=$pid
  pod dtrain-worker 1 w1.log "${Wf[@]}" --logdir="$dir/logs-w1"; w1=$pid
  max="$(sed -n 's/^ *dtrain\/max-completions: "\([0-9]*\)".*/\1/p' "$ROOT/deploy/kubernetes/dtrain-elastic.yaml")"
  if ! wait_for_line "$dir/chief.log" "^step 100," 120; then
    check "the elastic manifest's chief trains" false; tail -20 "$dir/chief.log" "$dir/ps.log"
  else
    # Scaled up to the annotation: pod index $max - 1 joins; scaled down: it gets SIGTERM and leaves. Scaled
    # past the annotation (started at the same time): pod index $max (dtrain worker $max + 1 = --max_workers) is
    # refused.
    k=$((max - 1)); id=$((max))  # the chief is dtrain worker 0, pod dtrain-worker-K worker K+1
    pod dtrain-worker "$k" wjoin.log "${Wf[@]}" --logdir="$dir/logs-join"; wj=$pid
    pod dtrain-worker "$max" wpast.log "${Wf[@]}" --logdir="$dir/logs-past"
    rc=0; wait "$pid" || rc=$?
    check "a pod past dtrain/max-completions ($max) exits 2 (got $rc)" test "$rc" = 2
    check "...naming --max_workers" grep -q "max_workers" "$dir/wpast.log"
    check "pod dtrain-worker-$k says it joins past the spec" wait_for_line "$dir/wjoin.log" "worker:$id (joining: past the spec's 3 workers)" 60
    check "ps 0 logs worker $id joined" wait_for_line "$dir/ps.log" "worker $id joined (4 workers, aggregating 4" 60
    check "the chief logs worker $id joined" wait_for_line "$dir/chief.log" "^step [0-9]*: worker $id joined" 20
    check "pod dtrain-worker-$k trains" wait_for_line "$dir/wjoin.log" "^step [0-9]*, loss" 30
    # kubectl exec job/dtrain-chief -- /opt/dtrain/bin/dtrain_ctl status: the pod's TF_CONFIG names the ps.
    env "${chief_env[@]}" "$B/dtrain_ctl" --rate_secs=0 status >"$dir/status.txt" 2>&1 || true
    cat "$dir/status.txt"
    check "dtrain_ctl status in the chief's pod lists worker $id active" grep -Eq "^$id +active" "$dir/status.txt"
    kill -TERM "$wj"
    rc=0; wait "$wj" || rc=$?
    check "pod dtrain-worker-$k exits 143 on SIGTERM (got $rc)" test "$rc" = 143
    check "...having left the cluster" grep -q "stopped by SIGTERM at step [0-9]*; it left the cluster" "$dir/wjoin.log"
    check "ps 0 logs worker $id left" wait_for_line "$dir/ps.log" "worker $id left (3 workers" 20
    for p in chief w0 w1 ps; do
      case $p in chief) q=$chief ;; w0) q=$w0 ;; w1) q=$w1 ;; ps) q=$ps_pid ;; esac
      rc=0; wait "$q" || rc=$?
      check "$p exits 0 (got $rc)" test "$rc" = 0
    done
    check "the run is complete, naming the worker that left" \
      grep -q "run complete: training reached step 1500 of 1500; 4 workers took part; left before the end: worker $id (stopped" "$dir/ps.log"
  fi
  if [ "$failed" != 0 ]; then for f in ps chief w0 wjoin; do echo "==== $f"; tail -15 "$dir/$f.log"; done; fi
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
