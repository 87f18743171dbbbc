#!/usr/bin/env bash
# Chaos with membership: each trial runs one elastic job on 127.0.0.1 (1 ps with --max_workers=4, a spec of one
# worker, the MLP, sync or async by turns, --elastic_batch=per_worker; checkpoints every 25 steps, the ps's applied
# journal and every worker's push journal) and, at random times drawn from a seeded RNG, makes workers 1-3 join, leave
# by SIGTERM, by kill -9 or by dtrain_ctl remove-worker, and kills the ps with kill -9 once (started again with the
# same flags; it restores its newest checkpoint and the workers carry on); every trial also changes the ps set: a
# second ps task joins (dtrain_ps --join) and leaves (dtrain_ctl remove-ps 1), in sync trials it is also killed with
# kill -9 and started again, and the one kill of ps 0 may come in such a move itself (as ps 0 fixes its step; async:
# as it announces the move, before the cut where every worker stopped pushing). A trial passes when every process exits by
# itself before its deadline, the ps and the chief exit 0 with "run complete", the push accounting balances, and
# scripts/check_updates.py finds nothing acknowledged lost or applied twice across the joins, leaves and the restart.
# Prints one line per trial and "elastic chaos: P/N trials passed; events: ...; updates checked U, lost L, doubled D".
# Usage: tests/elastic_chaos.sh [--trials=N] [--seed=S] [--steps=N]; exits 1 on a failure, 77 without the data set.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
trials=4; seed=$(( $(date +%s) % 100000 )); steps=1500
for a in "$@"; do
  case "$a" in
    --trials=*) trials="${a#*=}" ;;
    --seed=*) seed="${a#*=}" ;;
    --steps=*) steps="${a#*=}" ;;
    *) echo "usage: $0 [--trials=N] [--seed=S] [--steps=N]" >&2; exit 2 ;;
  esac
done
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
root="$(mktemp -d /tmp/dtrain_elastic_chaos.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$root"
}
trap cleanup EXIT
RANDOM=$seed
passed=0; events_all=""; checked_all=0; lost_all=0; doubled_all=0
alive() { kill -0 "$1" 2>/dev/null; }
# kill -9 of ps 0 as it fixes the step of the ps-set change just asked for (the move itself: before, while or after
# it saves its part of that step), started again with the same flags. $1: the number of such lines before the ask.
kill_ps0_in_move() {
  for _ in $(seq 100); do
    [ "$(grep -c "the job moves onto" "$dir/ps.log" || true)" -gt "$1" ] && break
    sleep 0.1
  done
  chief_done && return 0
  kill -KILL "$ps_pid" 2>/dev/null || true; wait "$ps_pid" 2>/dev/null || true
  "$B/dtrain_ps" "${C[@]}" "${PSF[@]}" >>"$dir/ps.log" 2>&1 &
  ps_pid=$!; pids+=($ps_pid); ps_killed=1; events+=" ps-kill9-in-move"
}
# Whether the chief has reported done to ps 0: the events end there (a ps 0 killed after it, while it waits for a
# killed worker's lease, is started again with no chief to come: a restart after the end, not chaos with membership).
chief_done() { grep -q "worker 0 is done" "$dir/ps.log"; }
# The global step the chief last printed.
chief_step() { sed -n 's/^step \([0-9]*\),.*/\1/p' "$1" | tail -1; }

for t in $(seq 1 "$trials"); do
  dir="$root/t$t"; mkdir -p "$dir/ckpt" "$dir/pushes"
  mode=$([ $((t % 2)) = 1 ] && echo sync || echo async)
  IFS=, read -r p0 p1 p2 <<<"$(python3 "$ROOT/scripts/free_ports.py" 3)"
  C=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1)
  PSF=(--job_name=ps --task_index=0 --max_workers=4 --worker_timeout_secs=3 --checkpoint_dir="$dir/ckpt"
       --save_checkpoint_steps=25 --journal_applied --registration_timeout_secs=60)
  W=(--job_name=worker --model=mlp --mode=$mode --train_steps=$steps --elastic_batch=per_worker --threads=1
     --log_every=10 --eval_every=0 --push_journal_dir="$dir/pushes" --startup_wait_secs=60 --rpc_timeout_secs=20)
  "$B/dtrain_ps" "${C[@]}" "${PSF[@]}" >"$dir/ps.log" 2>&1 &
  ps_pid=$!; pids+=($ps_pid)
  "$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=0 >"$dir/w0.log" 2>&1 &
  w0=$!; pids+=($w0)
  # Every trial also changes the ps set: a second ps task joins (--join) and leaves (remove-ps); in sync trials it is
  # also killed (kill -9) and started again (a joined task restarts with --join: ps 0 answers it is a task of the
  # job already). An async task restarted alone restores its own newest checkpoint, which holds other pushes than
  # the other task's: a kill of a task of an async job on several ps tasks is a restart, not a move (left out).
  PS1=(--job_name=ps --join=127.0.0.1:$p2 --max_workers=4 --worker_timeout_secs=3 --checkpoint_dir="$dir/ckpt"
       --save_checkpoint_steps=25 --journal_applied --registration_timeout_secs=60)
  ps1_pid=""; ps1_in=0   # ps1_in: ps task 1 was asked to join and not asked to leave
  declare -A wp=()   # worker index -> pid of its running process
  events=""; ps_killed=0
  start=$(date +%s)
  # Events every 1-3 s while the chief runs (at most 40 s of events).
  while alive "$w0" && [ $(( $(date +%s) - start )) -lt 40 ]; do
    sleep "$((1 + RANDOM % 3))"
    alive "$w0" || break
    k=$((1 + RANDOM % 3))
    what=$((RANDOM % 10))
    if [ "$what" -ge 8 ] && [ "$ps1_in" = 0 ] && { [ -z "$ps1_pid" ] || ! alive "$ps1_pid"; }; then
      moves=$(grep -c "the job moves onto" "$dir/ps.log" || true)
      "$B/dtrain_ps" "${C[@]}" "${PS1[@]}" >>"$dir/ps1.log" 2>&1 &
      ps1_pid=$!; pids+=($ps1_pid); ps1_in=1; events+=" ps1-join@$(chief_step "$dir/w0.log")"
      if [ "$ps_killed" = 0 ] && [ $((RANDOM % 3)) = 0 ]; then kill_ps0_in_move "$moves"; fi
    elif [ "$what" = 9 ] && [ "$ps1_in" = 1 ] && [ $((RANDOM % 2)) = 0 ]; then
      moves=$(grep -c "the job moves onto" "$dir/ps.log" || true)
      if "$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0 remove-ps 1 >>"$dir/ctl.log" 2>&1; then
        ps1_in=0; events+=" ps1-remove@$(chief_step "$dir/w0.log")"
        if [ "$ps_killed" = 0 ] && [ $((RANDOM % 3)) = 0 ]; then kill_ps0_in_move "$moves"; fi
      fi
    elif [ "$mode" = sync ] && [ "$what" = 8 ] && [ "$ps1_in" = 1 ] && alive "$ps1_pid" && \
         grep -q "moved onto 2 ps tasks" "$dir/w0.log"; then
      kill -KILL "$ps1_pid" 2>/dev/null || true; wait "$ps1_pid" 2>/dev/null || true
      "$B/dtrain_ps" "${C[@]}" "${PS1[@]}" >>"$dir/ps1.log" 2>&1 &
      ps1_pid=$!; pids+=($ps1_pid); events+=" ps1-kill9@$(chief_step "$dir/w0.log")"
    elif [ "$ps_killed" = 0 ] && [ "$what" = 0 ] && [ -n "$(ls "$dir/ckpt" | grep model.ckpt || true)" ] && \
         ! chief_done; then
      kill -KILL "$ps_pid" 2>/dev/null || true; wait "$ps_pid" 2>/dev/null || true
      "$B/dtrain_ps" "${C[@]}" "${PSF[@]}" >>"$dir/ps.log" 2>&1 &
      ps_pid=$!; pids+=($ps_pid); ps_killed=1; events+=" ps-kill9@$(chief_step "$dir/w0.log")"
    elif [ -z "${wp[$k]:-}" ] || ! alive "${wp[$k]}"; then
      "$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=$k >>"$dir/w$k.log" 2>&1 &
      wp[$k]=$!; pids+=(${wp[$k]}); events+=" join$k"
    elif [ "$what" -lt 4 ]; then
      kill -TERM "${wp[$k]}"; events+=" term$k"
    elif [ "$what" -lt 7 ]; then
      kill -KILL "${wp[$k]}"; events+=" kill9-$k"
    else
      "$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0 --rate_secs=0 remove-worker $k >>"$dir/ctl.log" 2>&1 || true
      events+=" remove$k"
    fi
  done
  # Every process ends by itself within 3 minutes.
  deadline=$(( $(date +%s) + 180 )); ok=1; why=""
  for p in "$w0" "$ps_pid"; do
    while alive "$p" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
    if alive "$p"; then ok=0; why+=" hang($p)"; kill -KILL "$p"; fi
  done
  set +e
  wait "$w0"; rc0=$?
  wait "$ps_pid"; rcps=$?
  set -e
  # ps task 1: in the set at the end, it completes with the run; removed, it was told to leave: exit 0 either way.
  if [ -n "$ps1_pid" ]; then
    while alive "$ps1_pid" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
    if alive "$ps1_pid"; then ok=0; why+=" ps1-hang"; kill -KILL "$ps1_pid"; fi
    set +e; wait "$ps1_pid"; rcps1=$?; set -e
    [ "$rcps1" = 0 ] || { ok=0; why+=" ps1-exit-$rcps1"; }
  fi
  for k in "${!wp[@]}"; do
    p=${wp[$k]}
    while alive "$p" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
    if alive "$p"; then ok=0; why+=" worker$k-hang"; kill -KILL "$p"; fi
  done
  [ "$rc0" = 0 ] || { ok=0; why+=" chief-exit-$rc0"; }
  [ "$rcps" = 0 ] || { ok=0; why+=" ps-exit-$rcps"; }
  # (A ps 0 killed near the end may come back after the last step: "reached step N while this task was down".)
  grep -Eq "run complete: training reached step $steps( of $steps| while this task was down)" "$dir/ps.log" || \
    { ok=0; why+=" not-complete"; }
  tail -5 "$dir/ps.log" | grep -q "(balanced)" || { ok=0; why+=" accounting"; }
  set +e
  out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$dir/ckpt" --worker_dir="$dir/pushes" --json 2>&1)
  rc_check=$?
  set -e
  [ "$rc_check" = 0 ] || { ok=0; why+=" check_updates-exit-$rc_check"; }
  read -r checked lost doubled <<<"$(python3 -c "
import json, sys
try:
    d = json.loads(sys.argv[1].strip().splitlines()[-1])
    print(d.get('updates_checked', -1), d.get('lost', 0), d.get('doubled', 0))
except Exception:
    print(-1, -1, -1)" "$out")"
  if [ "$lost" != 0 ] || [ "$doubled" != 0 ]; then ok=0; why+=" updates(lost=$lost,doubled=$doubled)"; fi
  checked_all=$((checked_all + (checked > 0 ? checked : 0)))
  lost_all=$((lost_all + (lost > 0 ? lost : 0))); doubled_all=$((doubled_all + (doubled > 0 ? doubled : 0)))
  events_all+="$events"
  if [ "$ok" = 1 ]; then
    passed=$((passed + 1)); verdict=passed
  else
    verdict="FAILED:$why"; cp -r "$dir" "/tmp/elastic_chaos_failed_t$t" 2>/dev/null || true
    echo "$out" | tail -5
  fi
  echo "trial $t ($mode):$events: $verdict; updates: $checked checked, lost $lost, doubled $doubled"
  unset wp
done
echo "elastic chaos: $passed/$trials trials passed; events:$events_all; updates checked $checked_all, lost $lost_all, doubled $doubled_all"
[ "$passed" = "$trials" ]
