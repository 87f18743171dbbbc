#!/usr/bin/env bash
# One task of a dtrain job under Slurm (started by srun, once per task; see dtrain.sbatch). Every task derives
# the same cluster spec from Slurm's environment: task i (SLURM_PROCID) runs on the i-th slot of the step's
# node list (SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE; srun's default block distribution) and listens
# on that node's address (its NodeAddr in scontrol, else its name) at port --port + i. Tasks 0..num_ps-1 are
# ps tasks, the rest workers (worker 0, the chief, is task num_ps). Then it runs dtrain_ps or dtrain_worker
# and exits with its exit code (1 if stopped by srun because another task failed).
#
#   srun -N 3 --ntasks-per-node=1 --kill-on-bad-exit=1 --label deploy/slurm/dtrain_task.sh \
#       [--num_ps=1] [--port=2222] [--ps_args="FLAGS"] [--cluster_file=PATH] WORKER_FLAGS...
#
# --cluster_file=PATH: task 0 writes the cluster spec there as JSON ({"ps": [...], "worker": [...]}; %j in PATH
# becomes the job id) before it starts its ps, for workers that join the running job later:
# `dtrain_worker --cluster_spec=PATH --job_name=worker --task_index=K ...` (docs/elastic_schedulers.md).
#
# Exit 2 with a message on bad arguments or an environment that is not a Slurm step.
set -euo pipefail
trap 'exit 1' TERM INT  # stopped by srun before starting the binary (see the end)
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${DTRAIN_BIN:-$ROOT/build/bin}"
NUM_PS=1; PORT=2222; PS_ARGS=""; CLUSTER_FILE=""
die() { echo "dtrain_task: $*" >&2; exit 2; }
worker_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --num_ps=*) NUM_PS="${1#*=}" ;;
    --port=*) PORT="${1#*=}" ;;
    --ps_args=*) PS_ARGS="${1#*=}" ;;
    --cluster_file=*) CLUSTER_FILE="${1#*=}" ;;
    --) shift; worker_args+=("$@"); break ;;
    *) worker_args+=("$1") ;;
  esac
  shift
done
read -r -a ps_args <<<"$PS_ARGS"

for v in SLURM_PROCID SLURM_NTASKS; do
  [ -n "${!v:-}" ] || die "$v is not set: run me with srun (see deploy/slurm/dtrain.sbatch)"
done
nodelist="${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:-}}"
per_node="${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-}}"
[ -n "$nodelist" ] && [ -n "$per_node" ] || die "no SLURM_STEP_NODELIST/SLURM_STEP_TASKS_PER_NODE: run me with srun"
ntasks="$SLURM_NTASKS"; procid="$SLURM_PROCID"
[[ "$NUM_PS" =~ ^[0-9]+$ ]] && [ "$NUM_PS" -ge 1 ] || die "--num_ps must be a positive integer, got '$NUM_PS'"
[ "$NUM_PS" -lt "$ntasks" ] ||
  die "--num_ps=$NUM_PS leaves no worker among $ntasks tasks (ask Slurm for more: sbatch -N $((NUM_PS + 1)) or more)"
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ $((PORT + ntasks - 1)) -le 65535 ] ||
  die "--port must be in 1..$((65536 - ntasks)) (task i uses port+i), got '$PORT'"

mapfile -t nodes < <(scontrol show hostnames "$nodelist")
[ "${#nodes[@]}" -ge 1 ] || die "scontrol could not expand the node list '$nodelist'"
# "2(x3),1" → 2 2 2 1: tasks on each node, in node-list order.
counts=()
IFS=, read -r -a groups <<<"$per_node"
for g in "${groups[@]}"; do
  if [[ "$g" =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
    for ((r = 0; r < BASH_REMATCH[2]; r++)); do counts+=("${BASH_REMATCH[1]}"); done
  elif [[ "$g" =~ ^[0-9]+$ ]]; then
    counts+=("$g")
  else
    die "cannot read the tasks-per-node list '$per_node'"
  fi
done
[ "${#counts[@]}" = "${#nodes[@]}" ] || die "tasks-per-node '$per_node' does not match the nodes '$nodelist'"

declare -A addr_of=()
node_address() {  # NodeAddr of a Slurm node (what its name resolves to for the cluster), else the name
  local a
  a="$(scontrol show node -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')"
  echo "${a:-$1}"
}
hosts=(); task_node=()
for i in "${!nodes[@]}"; do
  addr_of[${nodes[$i]}]="$(node_address "${nodes[$i]}")"
  for ((c = 0; c < counts[i]; c++)); do
    task_node+=("${nodes[$i]}")
    hosts+=("${addr_of[${nodes[$i]}]}:$((PORT + ${#hosts[@]}))")
  done
done
[ "${#hosts[@]}" = "$ntasks" ] || die "the step has ${#hosts[@]} task slots but SLURM_NTASKS=$ntasks"
if [ -n "${SLURMD_NODENAME:-}" ] && [ "${task_node[$procid]}" != "$SLURMD_NODENAME" ]; then
  die "task $procid runs on $SLURMD_NODENAME but block distribution puts it on ${task_node[$procid]}:" \
      "use srun's default --distribution=block"
fi
ps_hosts="$(IFS=,; echo "${hosts[*]:0:NUM_PS}")"
worker_hosts="$(IFS=,; echo "${hosts[*]:NUM_PS}")"
cluster=(--ps_hosts="$ps_hosts" --worker_hosts="$worker_hosts")
if [ -n "$CLUSTER_FILE" ] && [ "$procid" = 0 ]; then
  CLUSTER_FILE="${CLUSTER_FILE//%j/${SLURM_JOB_ID:-}}"
  quoted() { local IFS=,; set -- "${@/#/\"}"; set -- "${@/%/\"}"; echo "$*"; }
  # Written whole, then renamed: a joiner polling for it never reads half a file.
  printf '{"ps": [%s], "worker": [%s]}\n' "$(quoted "${hosts[@]:0:NUM_PS}")" "$(quoted "${hosts[@]:NUM_PS}")" \
    >"$CLUSTER_FILE.tmp.$$" && mv -f "$CLUSTER_FILE.tmp.$$" "$CLUSTER_FILE" ||
    die "cannot write --cluster_file=$CLUSTER_FILE"
  echo "dtrain_task: cluster spec written to $CLUSTER_FILE" >&2
fi
if [ "$procid" -lt "$NUM_PS" ]; then
  [ "$procid" != 0 ] || echo "dtrain_task: cluster ps=[$ps_hosts] worker=[$worker_hosts]" >&2
  cmd=("$BIN/dtrain_ps" --job_name=ps --task_index="$procid" "${cluster[@]}" "${ps_args[@]}")
else
  cmd=("$BIN/dtrain_worker" --job_name=worker --task_index=$((procid - NUM_PS)) "${cluster[@]}" "${worker_args[@]}")
fi
# When one task fails, srun (--kill-on-bad-exit) sends SIGTERM to the others; so does Slurm before the time
# limit (dtrain.sbatch's --signal). dtrain's binaries stop gracefully on it (a worker leaves, the chief evaluates
# and exports, a ps saves its final checkpoint) and take the signal this script passes on, within a second of
# Slurm's own, as the same one. srun's exit code is the highest of its tasks' codes, 128+signal for a task
# stopped by a signal: so a task stopped that way exits with 1 instead, and the job's exit code is the failed
# task's (e.g. 2 for a bad flag).
"${cmd[@]}" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; exit 1' TERM INT
rc=0
wait "$child" || rc=$?
[ "$rc" != 143 ] || rc=1  # the child got srun's SIGTERM before this shell did
exit "$rc"
