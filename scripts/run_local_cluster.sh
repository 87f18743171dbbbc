#!/usr/bin/env bash
# Starts a cluster on 127.0.0.1: NUM_PS ps tasks and NUM_WORKERS worker tasks, each its own process, on free
# ports; passes the remaining arguments to every worker; waits for all of them and exits non-zero if any
# process failed. Worker 0's output goes to stdout; every task's log goes to $LOGDIR/<job>_<i>.log. If worker 0
# fails, the other tasks are stopped; after --deadline_secs (default 86400) every task is stopped (exit 124).
#
#   scripts/run_local_cluster.sh [--ps N] [--workers N] [--logdir DIR] [--deadline_secs S] [--ps_flag FLAG]...
#                                [--] WORKER_FLAGS...
# (--ps_flag passes one flag to every ps task, e.g. --ps_flag --transport=grpc.)
#   scripts/run_local_cluster.sh --workers 2 -- --mode=sync --model=mlp --train_steps=2000
#   scripts/run_local_cluster.sh --workers 2 -- --model=lenet5.onnx --export_onnx=trained.onnx  # an ONNX file
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN:-$ROOT/build/bin}"
NUM_PS=1
NUM_WORKERS=2
LOGDIR=""
DEADLINE=86400
PS_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ps_flag) PS_FLAGS+=("$2"); shift 2 ;;
    --ps) NUM_PS="$2"; shift 2 ;;
    --workers) NUM_WORKERS="$2"; shift 2 ;;
    --logdir) LOGDIR="$2"; shift 2 ;;
    --deadline_secs) DEADLINE="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
for v in "$NUM_PS" "$NUM_WORKERS" "$DEADLINE"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "run_local_cluster: --ps, --workers, --deadline_secs need positive integers, got '$v'" >&2; exit 2; }
done
# A --model=PATH.onnx must be there (and is passed on as an absolute path).
# shellcheck source=scripts/model_args.sh
source "$ROOT/scripts/model_args.sh"
resolve_model_args run_local_cluster "$@"
set -- "${MODEL_ARGS[@]}"
[ -n "$LOGDIR" ] || LOGDIR="$(mktemp -d /tmp/dtrain_cluster.XXXXXX)"
mkdir -p "$LOGDIR"
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "run_local_cluster: $BIN/$b not found; build first (scripts/build.sh)" >&2; exit 2; }
done

ports="$(python3 "$ROOT/scripts/free_ports.py" $((NUM_PS + NUM_WORKERS)))"
IFS=, read -r -a P <<<"$ports"
ps_hosts=""; worker_hosts=""
for ((i = 0; i < NUM_PS; i++)); do ps_hosts+="${ps_hosts:+,}127.0.0.1:${P[$i]}"; done
for ((i = 0; i < NUM_WORKERS; i++)); do worker_hosts+="${worker_hosts:+,}127.0.0.1:${P[$((NUM_PS + i))]}"; done
cluster=(--ps_hosts="$ps_hosts" --worker_hosts="$worker_hosts")
echo "cluster: ps=[$ps_hosts] worker=[$worker_hosts]; logs in $LOGDIR" >&2

pids=()
timer=""
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap 'cleanup; exit 143' INT TERM
trap 'echo "run_local_cluster: deadline of $DEADLINE s passed; stopping every task" >&2; cleanup; exit 124' USR1
trap '[ -z "$timer" ] || kill "$timer" 2>/dev/null' EXIT
( trap 'kill "$s" 2>/dev/null; exit 0' TERM; sleep "$DEADLINE" & s=$!; wait "$s"; kill -USR1 $$ ) >/dev/null 2>&1 &
timer=$!
for ((i = 0; i < NUM_PS; i++)); do
  "$BIN/dtrain_ps" --job_name=ps --task_index=$i "${cluster[@]}" "${PS_FLAGS[@]}" >"$LOGDIR/ps_$i.log" 2>&1 &
  pids+=($!)
done
for ((i = 1; i < NUM_WORKERS; i++)); do
  "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" "$@" >"$LOGDIR/worker_$i.log" 2>&1 &
  pids+=($!)
done
# In the background too, so that the traps run at once (bash runs them only between commands).
"$BIN/dtrain_worker" --job_name=worker --task_index=0 "${cluster[@]}" "$@" 2>"$LOGDIR/worker_0.err" \
  > >(tee "$LOGDIR/worker_0.log") &
chief=$!
pids+=("$chief")
rc=0
wait "$chief" || rc=$?
unset 'pids[-1]'
failed=0
# A failed chief leaves the others waiting for it: stop them.
[ "$rc" = 0 ] || { echo "worker 0 exited with $rc (see $LOGDIR/worker_0.err)" >&2; failed=1; cleanup; }
i=0
for p in "${pids[@]}"; do
  wait "$p"; r=$?
  if [ "$r" != 0 ]; then echo "process $p exited with $r (logs in $LOGDIR)" >&2; failed=1; fi
done
exit $failed
