#!/usr/bin/env bash
# Starts a cluster on 127.0.0.1: NUM_PS ps tasks and NUM_WORKERS worker tasks, each its own process, on free
# ports; passes the remaining arguments to every worker; waits for all of them and exits with worker 0's exit
# code, or else the first other non-zero one (docs/faults_and_endings.md: 0 complete, 2 refused, 3 degraded, 4 a
# peer failed). Worker 0's output goes to stdout; every task's log goes to $LOGDIR/<job>_<i>.log. If worker 0
# fails, the other tasks are stopped. SIGINT (Ctrl-C) or SIGTERM to this script passes SIGTERM on to every task
# once and waits for their graceful stop (the chief evaluates and exports, the ps tasks save); a second one stops
# them at once. After --deadline_secs (default 86400) every task is stopped (exit 124).
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
signals=0
on_signal() {
  signals=$((signals + 1))
  if [ "$signals" = 1 ]; then
    echo "run_local_cluster: stopping every task gracefully (a second Ctrl-C stops them at once)" >&2
    cleanup
  else
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done  # another signal: each stops at once
  fi
}
trap on_signal INT TERM
# wait for one task, again when a signal's trap interrupted the wait; its exit code.
wait_task() {
  local r
  while true; do
    wait "$1"; r=$?
    kill -0 "$1" 2>/dev/null || return "$r"
  done
}
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
  > >(trap '' INT TERM; exec tee "$LOGDIR/worker_0.log") &  # tee outlives a signal to the process group
chief=$!
pids+=("$chief")
rc=0
wait_task "$chief" || rc=$?
# (The chief is kept in pids: a second signal while the others wrap up goes to it too, harmlessly.)
# The ps tasks tell the others when the chief failed or stopped; a task that does not hear it is stopped.
if [ "$rc" != 0 ]; then
  echo "worker 0 exited with $rc (see $LOGDIR/worker_0.err)" >&2
  if [ "$signals" = 0 ]; then
    for ((t = 0; t < 30; t++)); do  # 15 s for them to hear it and leave by themselves
      alive=0
      for p in "${pids[@]}"; do [ "$p" = "$chief" ] || ! kill -0 "$p" 2>/dev/null || alive=1; done
      [ "$alive" = 1 ] || break
      sleep 0.5
    done
    [ "$alive" = 0 ] || cleanup
  fi
fi
code=$rc
for p in "${pids[@]}"; do
  [ "$p" != "$chief" ] || continue
  wait_task "$p"; r=$?
  if [ "$r" != 0 ]; then
    echo "process $p exited with $r (logs in $LOGDIR)" >&2
    [ "$code" != 0 ] || code=$r
  fi
done
exit "$code"
