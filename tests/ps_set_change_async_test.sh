#!/usr/bin/env bash
# ps tasks join and leave a running async job (ps/core/parameter_server_control.cc, MoveAsync) on 127.0.0.1: 2
# workers train the cnn asynchronously on 1 ps task; a second ps task started with --join is taken in (1 -> 2), then
# dtrain_ctl remove-ps 1 takes it out again (2 -> 1) while worker 1 has just been killed (kill -9), and the run
# trains to its last step. An async move needs a cut: every worker lets its push in flight land and stops, ps 0
# saves its part at its step once every active worker has (a killed one is waited for until its lease ends), every
# other old task saves that step, and the new set restores it. Checks:
#   - ps 0 and the chief log each move at the cut's step; every old task saved its part of that step; the new task
#     restored its share resharded; the chief resumes at that step (no step lost) and prints the pause (< 10 s,
#     kept under the cut's wait for the killed worker's lease: < 10 s + --worker_timeout_secs);
#   - worker 1, started again after the job went back to 1 task, joins it;
#   - every process ends with its exit code: ps 0 and both workers 0 (run complete), the removed task 0 with the
#     line that says it left the job;
#   - scripts/check_updates.py on the journals: every acknowledged push applied exactly once across 1 -> 2 -> 1 ps
#     tasks, none lost or doubled;
#   - dlrm, async and elastic (--max_workers, its input handed out by ps 0, each worker's next batch held a pull
#     ahead): 1 -> 2 -> 1 ps tasks, the rows moving with the tasks, each worker drawing its batches again at most
#     on its first step and once per move, the run complete, check_updates clean.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
passed=0; failed=0
source "$ROOT/tests/checks.sh"
make_test_dir dtrain_ps_set_async_test

STEPS=${PS_SET_ASYNC_STEPS:-800}
LEASE=6
IFS=, read -r p0 p1 p2 p3 <<<"$(python3 "$ROOT/scripts/free_ports.py" 4)"
C=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1,127.0.0.1:$p2)
W=(--job_name=worker --model=cnn --mode=async --train_steps=$STEPS --threads=1 --log_every=5 --eval_every=0
   --rpc_timeout_secs=30 --startup_wait_secs=60)
P=(--job_name=ps --worker_timeout_secs=$LEASE --journal_applied)
m="$dir/async"
mkdir -p "$m"
"$B/dtrain_ps" "${C[@]}" "${P[@]}" --task_index=0 --checkpoint_dir="$m/ckpt" >"$m/ps0.log" 2>&1 &
ps0=$!; bg+=($ps0)
for i in 0 1; do
  # Worker 1 talks gRPC alone, the chief shared memory (auto).
  "$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=$i --push_journal_dir="$m/pushes" \
    $([ $i = 1 ] && echo --transport=grpc) >"$m/w$i.log" 2>&1 &
  eval "w$i=\$!"; bg+=($!)
done
# Async steps are global: the chief's lines name whichever step its pull got.
wait_step "$m/w0.log" 40

# ---- 1 -> 2: a task joins ----
"$B/dtrain_ps" "${C[@]}" "${P[@]}" --join=127.0.0.1:$p3 --checkpoint_dir="$m/ckpt" >"$m/ps1.log" 2>&1 &
ps1=$!; bg+=($ps1)
check "ps 0 takes the joiner in" wait_for_line "$m/ps0.log" "ps task 1 (127.0.0.1:$p3) joins at the next step boundary: 2 ps tasks" 30
check "the chief moves the job onto 2 ps tasks" wait_for_line "$m/w0.log" "^step [0-9]*: the job moved onto 2 ps tasks" 60
check "...and so does worker 1" wait_for_line "$m/w1.log" "moving from 1 onto 2 ps tasks" 30
grow_step=$(grep -o "^step [0-9]*: the job moved onto 2" "$m/w0.log" | awk '{print $2}' | tr -d :)
check "ps 0 cut the job at step $grow_step: its part saved" grep -q "ps task 0: saved its part of step $grow_step for the move" "$m/ps0.log"
check "ps 0 logs the move at step $grow_step" grep -q "the job moved from 1 onto 2 ps tasks at step $grow_step" "$m/ps0.log"
check "ps 1 restored its share of step $grow_step, resharded" grep -qF "model.ckpt-$grow_step.ps*-of-1 resharded from 1 ps task onto 2" "$m/ps1.log"
check "the chief resumes at step $grow_step (no step lost)" grep -q "worker_client[a-z_]*\.cc.*ps task 0 is at step $grow_step " "$m/w0.log"

# ---- 2 -> 1 while worker 1 is killed: the cut waits for its lease, then the job moves ----
wait_step "$m/w0.log" $((grow_step + 40))
kill -KILL "$w1"; wait "$w1" 2>/dev/null || true
CTL=("$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0)
"${CTL[@]}" remove-ps 1 >"$m/ctl_remove1.txt" 2>&1 || true
cat "$m/ctl_remove1.txt"
check "remove-ps 1 is taken" grep -q "ps task 1 (127.0.0.1:$p3) leaves at the next step boundary: 1 ps task$" "$m/ctl_remove1.txt"
check "the chief moves the job back onto 1 ps task" wait_for_line "$m/w0.log" "^step [0-9]*: the job moved onto 1 ps task " 60
shrink_step=$(grep -o "^step [0-9]*: the job moved onto 1" "$m/w0.log" | awk '{print $2}' | tr -d :)
check "...having waited for worker 1 until its lease ended" grep -q "worker 1.*no contact for" "$m/ps0.log"
check "ps 0 and ps 1 saved their parts of step $shrink_step" \
  bash -c "grep -q 'ps task 0: saved its part of step $shrink_step for the move' '$m/ps0.log' && grep -q 'ps task 1: saved its part of step $shrink_step for the move' '$m/ps1.log'"
check "ps 0 logs the move at step $shrink_step" grep -q "the job moved from 2 onto 1 ps tasks at step $shrink_step" "$m/ps0.log"
check "the chief resumes at step $shrink_step (no step lost)" grep -q "worker_client[a-z_]*\.cc.*ps task 0 is at step $shrink_step " "$m/w0.log"
rc=0; wait "$ps1" || rc=$?
check "the removed ps task exits 0 (got $rc)" test "$rc" = 0
check "...saying it left the job at step $shrink_step" grep -q "ps task 1 left the job at step $shrink_step (removed" "$m/ps1.log"
# Worker 1 started again (as a scheduler restarts it) joins the job on its 1 task.
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=1 --push_journal_dir="$m/pushes" --transport=grpc \
  >"$m/w1b.log" 2>&1 &
w1=$!; bg+=($w1)
for p in w0 w1 ps0; do
  rc=0; wait "${!p}" || rc=$?
  check "$p exits 0 (got $rc)" test "$rc" = 0
done
check "the run completes" grep -q "run complete: training reached step $STEPS of $STEPS" "$m/ps0.log"
check "the restarted worker 1 trained" grep -q "^step [0-9]*, loss" "$m/w1b.log"
echo "pauses (the chief, from hearing of the move to its first pull on the new set):"
grep "^step [0-9]*: the job moved onto" "$m/w0.log"
pauses=($(grep -o "^step [0-9]*: the job moved onto .* in [0-9.]* s" "$m/w0.log" | awk '{print $(NF-1)}'))
check "the move onto 2 tasks paused training ${pauses[0]} s (< 10 s)" python3 -c "import sys; sys.exit(not ${pauses[0]} < 10)"
check "the move back paused training ${pauses[1]} s (< 10 s + the killed worker's lease of ${LEASE} s)" \
  python3 -c "import sys; sys.exit(not ${pauses[1]} < 10 + $LEASE)"
out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$m/ckpt" --worker_dir="$m/pushes" 2>&1) || true
echo "$out" | tail -1
check "check_updates: lost 0, doubled 0 across 1 -> 2 -> 1 ps tasks" \
  bash -c "echo '$out' | grep -q 'ps tasks over time: 1 -> 2 -> 1' && echo '$out' | grep -q 'lost 0, doubled 0'"

# ---- dlrm, async and elastic: the rows move too, and each worker's batch read a pull ahead is drawn again ----
d="$dir/dlrm"
mkdir -p "$d"
"$B/dtrain_convert" --synthetic_ctr --examples=20000 --test_examples=1000 --out="$d/ctr" >/dev/null
DSTEPS=1500
DW=(--job_name=worker --model=dlrm --data_dir="$d/ctr" --data_format=criteo --embedding_dim=8 --mode=async
    --elastic_batch=per_worker --batch_size=64 --train_steps=$DSTEPS --threads=1 --seed=7 --log_every=5
    --eval_every=0 --rpc_timeout_secs=30 --startup_wait_secs=60 --debug_step_delay_ms=20 --push_journal_dir="$d/pushes")
DP=(--job_name=ps --max_workers=2 --worker_timeout_secs=$LEASE --journal_applied --checkpoint_dir="$d/ckpt")
"$B/dtrain_ps" "${C[@]}" "${DP[@]}" --task_index=0 >"$d/ps0.log" 2>&1 &
ps0=$!; bg+=($ps0)
for i in 0 1; do
  "$B/dtrain_worker" "${C[@]}" "${DW[@]}" --task_index=$i >"$d/w$i.log" 2>&1 &
  eval "w$i=\$!"; bg+=($!)
done
wait_step "$d/w0.log" 100
"$B/dtrain_ps" "${C[@]}" "${DP[@]}" --join=127.0.0.1:$p3 >"$d/ps1.log" 2>&1 &
ps1=$!; bg+=($ps1)
check "dlrm: the chief moves the job onto 2 ps tasks" wait_for_line "$d/w0.log" "^step [0-9]*: the job moved onto 2 ps tasks" 60
dgrow=$(grep -o "^step [0-9]*: the job moved onto 2" "$d/w0.log" | awk '{print $2}' | tr -d :)
check "dlrm: ps 1 restored its share of the rows of step $dgrow" grep -qF "model.ckpt-$dgrow.ps*-of-1 resharded from 1 ps task onto 2" "$d/ps1.log"
wait_step "$d/w0.log" $((dgrow + 100))
"$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0 remove-ps 1 >"$d/ctl_remove1.txt" 2>&1 || true
check "dlrm: the chief moves the job back onto 1 ps task" wait_for_line "$d/w0.log" "^step [0-9]*: the job moved onto 1 ps task " 60
for p in w0 w1 ps0 ps1; do
  rc=0; wait "${!p}" || rc=$?
  check "dlrm: $p exits 0 (got $rc)" test "$rc" = 0
done
check "dlrm: the run completes" grep -q "run complete: training reached step $DSTEPS of $DSTEPS" "$d/ps0.log"
for w in 0 1; do
  redrawn=$(sed -n "s/^worker $w: \([0-9]*\) step(s) drew their batches again.*/\1/p" "$d/w$w.log")
  check "dlrm: worker $w drew its batches again on ${redrawn:-0} step(s) (at most 3: its first and one per move)" \
    test "${redrawn:-0}" -le 3
done
out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$d/ckpt" --worker_dir="$d/pushes" 2>&1) || true
echo "$out" | tail -1
check "dlrm: check_updates: lost 0, doubled 0 across 1 -> 2 -> 1 ps tasks" \
  bash -c "echo '$out' | grep -q 'ps tasks over time: 1 -> 2 -> 1' && echo '$out' | grep -q 'lost 0, doubled 0'"

echo "ps_set_change_async_test: $passed passed, $failed failed"
if [ "$failed" != 0 ]; then
  for f in "$m"/*.log; do echo "== $f"; tail -n 8 "$f"; done
  exit 1
fi
