#!/usr/bin/env bash
# deploy/kubernetes/*.yaml validate offline against Kubernetes' API schemas and dtrain's TF_CONFIG rules
# (deploy/kubernetes/validate/validate.mjs; no cluster needed). Broken copies of the manifest must fail, each
# with a message naming what is wrong: a misspelt field, a wrong type, a bad enum value, a missing required
# field, a TF_CONFIG that lists more workers than the Job runs, and invalid TF_CONFIG JSON.
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
if [ "$rc" = 0 ] && grep -q ": ok (Service/dtrain, Job/dtrain-ps, Job/dtrain-worker)" <<<"$out"; then
  passed=$((passed + 1))
else
  echo "FAIL: the shipped manifests do not validate (exit $rc)"; failed=$((failed + 1))
fi

# broken NAME SED-EXPRESSION EXPECTED-MESSAGE: a copy changed by sed must fail with that message.
broken() {
  local f="$dir/$1.yaml" rc=0 out
  sed "$2" "$ROOT/deploy/kubernetes/dtrain-cluster.yaml" >"$f"
  if cmp -s "$f" "$ROOT/deploy/kubernetes/dtrain-cluster.yaml"; then
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

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
