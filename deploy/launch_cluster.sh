#!/usr/bin/env bash
# Launches every task of a cluster spec: one dtrain_ps per "ps" address and one dtrain_worker per "worker"
# address, each on its host. Tasks on 127.0.0.1/localhost/this host's name run here; others run over ssh
# (key-based, the same dtrain build path on every host: --remote_bin). Every process gets the same cluster spec
# (via TF_CONFIG), so any of them may start first. Waits for all tasks; exits non-zero if any failed.
#
#   deploy/launch_cluster.sh --cluster_spec=cluster.json [--remote_bin=/opt/dtrain/bin] [--logdir=DIR] \
#       -- --mode=sync --model=cnn --train_steps=2000
# cluster.json: {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SPEC=""; REMOTE_BIN=""; LOGDIR=""; LOCAL_BIN="${DTRAIN_BIN:-$ROOT/build/bin}"
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster_spec=*) SPEC="${1#*=}"; shift ;;
    --remote_bin=*) REMOTE_BIN="${1#*=}"; shift ;;
    --logdir=*) LOGDIR="${1#*=}"; shift ;;
    --) shift; break ;;
    *) echo "launch_cluster: unknown argument '$1' (flags for the workers go after --)" >&2; exit 2 ;;
  esac
done
[ -n "$SPEC" ] || { echo "launch_cluster: --cluster_spec=FILE.json is required" >&2; exit 2; }
[ -r "$SPEC" ] || { echo "launch_cluster: cannot read cluster spec '$SPEC'" >&2; exit 2; }
[ -n "$REMOTE_BIN" ] || REMOTE_BIN="$LOCAL_BIN"
[ -n "$LOGDIR" ] || LOGDIR="$(mktemp -d /tmp/dtrain_launch.XXXXXX)"
mkdir -p "$LOGDIR"

# One line per task: "job index host address"; the JSON is parsed by Python's standard library.
tasks="$(python3 - "$SPEC" <<'PY'
import json, sys
try:
    spec = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit("launch_cluster: %s is not valid JSON: %s" % (sys.argv[1], e))
for job in ("ps", "worker"):
    addrs = spec.get(job)
    if not isinstance(addrs, list) or not addrs:
        sys.exit("launch_cluster: cluster spec needs a non-empty '%s' list" % job)
    for i, a in enumerate(addrs):
        host = a.rsplit(":", 1)[0].strip("[]")
        print(job, i, host, a)
PY
)" || exit 2
cluster_json="$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(json.dumps({"ps": s["ps"], "worker": s["worker"]}))' "$SPEC")"

is_local() { case "$1" in 127.*|localhost|"$(hostname)"|"$(hostname -f 2>/dev/null)") return 0 ;; esac; return 1; }
quote() { printf "%q " "$@"; }

pids=(); names=()
while read -r job index host address; do
  tf_config="{\"cluster\": $cluster_json, \"task\": {\"type\": \"$job\", \"index\": $index}}"
  if [ "$job" = ps ]; then cmd=(dtrain_ps); else cmd=(dtrain_worker "$@"); fi
  log="$LOGDIR/${job}_${index}.log"
  if is_local "$host"; then
    TF_CONFIG="$tf_config" "$LOCAL_BIN/${cmd[0]}" "${cmd[@]:1}" >"$log" 2>&1 &
  else
    ssh -o BatchMode=yes "$host" "TF_CONFIG=$(printf %q "$tf_config") $(quote "$REMOTE_BIN/${cmd[0]}" "${cmd[@]:1}")" \
      >"$log" 2>&1 &
  fi
  pids+=($!); names+=("$job:$index@$host")
done <<<"$tasks"
echo "launched ${#pids[@]} tasks; logs in $LOGDIR" >&2
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' INT TERM
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  if [ "$rc" != 0 ]; then echo "${names[$i]} exited with $rc (log: $LOGDIR)" >&2; failed=1; fi
done
grep -h "test accuracy" "$LOGDIR"/worker_0.log 2>/dev/null | tail -1
exit $failed
