#!/usr/bin/env bash
# ps tasks join and leave a running sync job (dtrain_ps --join, dtrain_ctl add-ps / remove-ps; ps/core/
# ps_set_plan.h) on 127.0.0.1: 2 workers train the cnn on 1 ps task; a second ps task started with --join is taken
# in at the next step boundary (1 -> 2), then a third (2 -> 3); dtrain_ctl remove-ps 1 takes out the task in the
# middle (3 -> 2: the last one takes its index), then the renumbered one (2 -> 1), and the run trains to its last
# step. Checks:
#   - ps 0 and the chief log each move with its step; the chief prints how long the job paused (the issue's target
#     for the cnn is 2 s; asserted under 10 s for loaded CI machines); no step is lost (the run resumes at the
#     step it moved at);
#   - worker 1, killed (kill -9) while the job runs on 2 ps tasks and started again with the spec's --ps_hosts,
#     hears the job's set from ps 0 and connects to it;
#   - every process ends with its exit code: ps 0, both workers 0 (run complete), each removed ps task 0 with the
#     line that says it left the job;
#   - the final values equal those of a run that kept its 1 ps task all along (within 1e-6; in sync mode 0): the
#     slices moved with their optimizer slots;
#   - scripts/check_updates.py on the journals (--journal_applied, --push_journal_dir): every acknowledged push
#     applied exactly once across 1 -> 2 -> 3 -> 2 -> 1 ps tasks, none lost or doubled;
#   - ps 0 killed (kill -9) in a move and started again with the spec: the run completes, every process exits 0,
#     check_updates finds nothing lost or doubled;
#   - refusals are one line and exit 1: remove-ps 0, add-ps of a task of the job, and a second change while one is
#     under way; dtrain_ps --join with a --task_index that is not the next exits 2.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
/usr/bin/python3 -c "import numpy" 2>/dev/null || skip "python3-numpy is not installed (scripts/install_deps.sh)"
passed=0; failed=0
source "$ROOT/tests/checks.sh"
make_test_dir dtrain_ps_set_test

STEPS=${PS_SET_STEPS:-240}
IFS=, read -r p0 p1 p2 p3 p4 <<<"$(python3 "$ROOT/scripts/free_ports.py" 5)"
C=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1,127.0.0.1:$p2)
W=(--job_name=worker --model=cnn --mode=sync --train_steps=$STEPS --threads=1 --log_every=5 --eval_every=0
   --rpc_timeout_secs=30 --startup_wait_secs=60)
P=(--job_name=ps --worker_timeout_secs=10 --journal_applied)
P_RUN=()  # more flags for a run's ps 0

# run NAME: ps 0 and two workers of one job, in the background (their pids in ps0 w0 w1).
run() {
  local name=$1
  mkdir -p "$dir/$name"
  "$B/dtrain_ps" "${C[@]}" "${P[@]}" "${P_RUN[@]}" --task_index=0 --checkpoint_dir="$dir/$name/ckpt" \
    >"$dir/$name/ps0.log" 2>&1 &
  ps0=$!; bg+=($ps0)
  for i in 0 1; do
    # Worker 1 talks gRPC alone (the new set reaches it in gRPC's pull header), the chief shared memory (auto).
    "$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=$i --push_journal_dir="$dir/$name/pushes" \
      $([ $i = 1 ] && echo --transport=grpc) \
      >"$dir/$name/w$i.log" 2>&1 &
    eval "w$i=\$!"; bg+=($!)
  done
}

# ---- the moving run: 1 -> 2 -> 3 -> 2 -> 1 ps tasks ----
run moving
m="$dir/moving"
wait_for_line "$m/w0.log" "^step 40," 120 || { echo "FAIL: the chief did not reach step 40"; tail "$m/w0.log"; exit 1; }
set +e
"$B/dtrain_ps" "${C[@]}" "${P[@]}" --task_index=3 --join=127.0.0.1:$p3 --checkpoint_dir="$m/ckpt" >"$m/bad_join.log" 2>&1
rc_bad=$?
set -e
check "--join with a --task_index that is not the next exits 2 (got $rc_bad)" test "$rc_bad" = 2
check "...saying which index" grep -q "its --task_index is 1" "$m/bad_join.log"
"$B/dtrain_ps" "${C[@]}" "${P[@]}" --join=127.0.0.1:$p3 --checkpoint_dir="$m/ckpt" >"$m/ps1.log" 2>&1 &
ps1=$!; bg+=($ps1)
check "ps 0 takes the joiner in" wait_for_line "$m/ps0.log" "ps task 1 (127.0.0.1:$p3) joins at the next step boundary: 2 ps tasks" 30
check "the chief moves the job onto 2 ps tasks" wait_for_line "$m/w0.log" "^step [0-9]*: the job moved onto 2 ps tasks" 60
check "...and so does worker 1" wait_for_line "$m/w1.log" "moving from 1 onto 2 ps tasks" 30
grow_step=$(grep -o "^step [0-9]*: the job moved onto 2" "$m/w0.log" | awk '{print $2}' | tr -d :)
check "ps 0 logs the move at step $grow_step" grep -q "the job moved from 1 onto 2 ps tasks at step $grow_step" "$m/ps0.log"
check "ps 1 restored its share of step $grow_step, resharded" grep -qF "model.ckpt-$grow_step.ps*-of-1 resharded from 1 ps task onto 2" "$m/ps1.log"
# Worker 1 killed and started again with the spec's --ps_hosts (as a scheduler restarts it): ps 0 names the job's
# set when it registers, and it connects to both tasks.
kill -KILL "$w1"; wait "$w1" 2>/dev/null || true
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=1 --push_journal_dir="$m/pushes" --transport=grpc \
  >"$m/w1b.log" 2>&1 &
w1=$!; bg+=($w1)
check "a worker restarted with the old --ps_hosts hears the job's set" \
  wait_for_line "$m/w1b.log" "moving from 1 onto 2 ps tasks (the job moved before)" 60
"$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0 --rate_secs=0 status >"$m/status.txt" 2>&1 || true
cat "$m/status.txt"
check "dtrain_ctl status lists the job's 2 ps tasks" grep -Eq "^1 +127.0.0.1:$p3 " "$m/status.txt"
# Training goes on over both tasks; then the refusals, a third task joins, ps 1 (a task in the middle) leaves and
# the last one takes its place, then that one leaves too.
target=$((grow_step + 30))
for _ in $(seq 600); do s=$(last_step "$m/w0.log"); [ "${s:-0}" -ge "$target" ] && break; sleep 0.1; done
CTL=("$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0)
set +e
"${CTL[@]}" remove-ps 0 >"$m/ctl_remove0.txt" 2>&1; rc_r0=$?
"${CTL[@]}" add-ps 127.0.0.1:$p3 >"$m/ctl_add_again.txt" 2>&1; rc_again=$?
set -e
check "remove-ps 0 is refused, exit 1 (got $rc_r0)" test "$rc_r0" = 1
check "...one line: ps 0 stays" grep -q "ps task 0 holds the global step" "$m/ctl_remove0.txt"
check "add-ps of a task of the job is refused (got $rc_again)" test "$rc_again" = 1
check "...saying so" grep -q "is a ps task of the job already" "$m/ctl_add_again.txt"
"$B/dtrain_ps" "${C[@]}" "${P[@]}" --join=127.0.0.1:$p4 --checkpoint_dir="$m/ckpt" >"$m/ps2.log" 2>&1 &
ps2=$!; bg+=($ps2)
check "the chief moves the job onto 3 ps tasks" wait_for_line "$m/w0.log" "^step [0-9]*: the job moved onto 3 ps tasks" 60
grow3_step=$(grep -o "^step [0-9]*: the job moved onto 3" "$m/w0.log" | awk '{print $2}' | tr -d :)
target=$((grow3_step + 5))
for _ in $(seq 600); do s=$(last_step "$m/w0.log"); [ "${s:-0}" -ge "$target" ] && break; sleep 0.1; done
set +e
"${CTL[@]}" remove-ps 1 >"$m/ctl_remove1.txt" 2>&1; rc_r1=$?
"${CTL[@]}" add-ps 127.0.0.1:1 >"$m/ctl_busy.txt" 2>&1; rc_busy=$?
set -e
cat "$m"/ctl_*.txt
check "remove-ps 1 (a task in the middle) is taken (got $rc_r1)" test "$rc_r1" = 0
check "...one line: it leaves, the last takes its place" grep -q "ps task 1 (127.0.0.1:$p3) leaves at the next step boundary: 2 ps tasks; ps task 2 (127.0.0.1:$p4) becomes ps task 1$" "$m/ctl_remove1.txt"
check "a second change while one is under way is refused (got $rc_busy)" test "$rc_busy" = 1
check "...saying so" grep -q "under way already" "$m/ctl_busy.txt"
check "the chief moves the job onto 2 ps tasks again" wait_for_line "$m/w0.log" "^step [0-9]*: the job moved onto 2 ps tasks (127.0.0.1:$p0,127.0.0.1:$p4)" 60
middle_step=$(grep -o "^step [0-9]*: the job moved onto 2 ps tasks (127.0.0.1:$p0,127.0.0.1:$p4)" "$m/w0.log" | awk '{print $2}' | tr -d :)
check "ps 0 logs the move at step $middle_step" grep -q "the job moved from 3 onto 2 ps tasks at step $middle_step" "$m/ps0.log"
check "the last task takes the leaving one's place" grep -q "the job moved from 3 onto 2 ps tasks at step $middle_step (this task was ps task 2 of 3" "$m/ps2.log"
rc=0; wait "$ps1" || rc=$?
check "the removed ps task exits 0 (got $rc)" test "$rc" = 0
check "...saying it left the job at step $middle_step" grep -q "ps task 1 left the job at step $middle_step (removed" "$m/ps1.log"
target=$((middle_step + 5))
for _ in $(seq 600); do s=$(last_step "$m/w0.log"); [ "${s:-0}" -ge "$target" ] && break; sleep 0.1; done
"${CTL[@]}" remove-ps 1 >"$m/ctl_remove_last.txt" 2>&1 || true
check "remove-ps 1 (the renumbered task, now the last) is taken" grep -q "ps task 1 (127.0.0.1:$p4) leaves at the next step boundary: 1 ps task$" "$m/ctl_remove_last.txt"
check "the chief moves the job back onto 1 ps task" wait_for_line "$m/w0.log" "^step [0-9]*: the job moved onto 1 ps task " 60
shrink_step=$(grep -o "^step [0-9]*: the job moved onto 1" "$m/w0.log" | awk '{print $2}' | tr -d :)
check "ps 0 logs the move at step $shrink_step" grep -q "the job moved from 2 onto 1 ps tasks at step $shrink_step" "$m/ps0.log"
rc=0; wait "$ps2" || rc=$?
check "the renumbered ps task exits 0 when it leaves (got $rc)" test "$rc" = 0
check "...saying it left the job at step $shrink_step" grep -q "ps task 1 left the job at step $shrink_step (removed" "$m/ps2.log"
for p in w0 w1 ps0; do
  rc=0; wait "${!p}" || rc=$?
  check "moving run: $p exits 0 (got $rc)" test "$rc" = 0
done
check "the run completes" grep -q "run complete: training reached step $STEPS of $STEPS" "$m/ps0.log"
for s in $grow_step $grow3_step $middle_step $shrink_step; do
  check "the chief resumes at step $s after the move (no step lost)" \
    grep -q "worker_client[a-z_]*\.cc.*ps task 0 is at step $s " "$m/w0.log"
done
echo "pauses (the chief, from the step boundary to its first pull on the new set):"
grep "^step [0-9]*: the job moved onto" "$m/w0.log"
for pause in $(grep -o "^step [0-9]*: the job moved onto .* in [0-9.]* s" "$m/w0.log" | awk '{print $(NF-1)}'); do
  check "the move paused training ${pause} s (< 10 s)" python3 -c "import sys; sys.exit(not $pause < 10)"
done
out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$m/ckpt" --worker_dir="$m/pushes" 2>&1) || true
echo "$out" | tail -1
check "check_updates: lost 0, doubled 0 across 1 -> 2 -> 3 -> 2 -> 1 ps tasks" \
  bash -c "echo '$out' | grep -q 'ps tasks over time: 1 -> 2 -> 3 -> 2 -> 1' && echo '$out' | grep -q 'lost 0, doubled 0'"

# ---- ps 0 killed (kill -9) as the job moves onto 2 ps tasks, and started again with the spec ----
# Killed when it logs the move's step: before or while it saves its part of that step's checkpoint, or while the
# chief restores the tasks. The chief brings the new set to the newest step every task can restore (the move's, or
# the periodic checkpoint before it when ps 0's part was never saved), the restarted ps 0 takes the set from it, and
# the run completes with every acknowledged push applied once.
P_RUN=(--save_checkpoint_steps=20)
run killed
k="$dir/killed"
wait_for_line "$k/w0.log" "^step 40," 120 || { echo "FAIL: the chief did not reach step 40"; tail "$k/w0.log"; exit 1; }
"$B/dtrain_ps" "${C[@]}" "${P[@]}" "${P_RUN[@]}" --join=127.0.0.1:$p3 --checkpoint_dir="$k/ckpt" >"$k/ps1.log" 2>&1 &
ps1=$!; bg+=($ps1)
check "ps 0 fixes the step of the move" wait_for_line "$k/ps0.log" "the job moves onto 2 ps tasks here" 30
kill -KILL "$ps0"; wait "$ps0" 2>/dev/null || true
"$B/dtrain_ps" "${C[@]}" "${P[@]}" "${P_RUN[@]}" --task_index=0 --checkpoint_dir="$k/ckpt" >"$k/ps0b.log" 2>&1 &
ps0=$!; bg+=($ps0)
check "the restarted ps 0 runs on the job's 2 ps tasks" \
  wait_for_line "$k/ps0b.log" "the job moved from 1 onto 2 ps tasks at step" 90
for p in w0 w1 ps0 ps1; do
  rc=0; wait "${!p}" || rc=$?
  check "ps 0 killed in a move: $p exits 0 (got $rc)" test "$rc" = 0
done
check "...and the run completes" grep -q "run complete: training reached step $STEPS of $STEPS" "$k/ps0b.log"
grep -h "restarted during the move\|every ps task restored the checkpoint of step\|the job moved onto 2 ps tasks" \
  "$k/w0.log" || true
if grep -q "restarted during the move" "$k/w0.log"; then
  # ps 0's part of the move's checkpoint saved: that step, nothing trained again; else the checkpoint before it,
  # which the chief's line names.
  move=$(grep -o "restarted during the move at step [0-9]*" "$k/w0.log" | head -1 | awk '{print $NF}')
  back=$(grep -o "every ps task restored the checkpoint of step [0-9]*" "$k/w0.log" | tail -1 | awk '{print $NF}')
  if [ "${back:-0}" -lt "$move" ]; then
    check "...the chief's line says the job went back to step $back" \
      grep -q "^step $move: the job moved onto 2 ps tasks .*, back at step $back (ps 0 restarted during the move)" "$k/w0.log"
  else
    check "...the move's own checkpoint restored (step $back = $move)" test "$back" = "$move"
  fi
fi
out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$k/ckpt" --worker_dir="$k/pushes" 2>&1) || true
echo "$out" | tail -1
check "check_updates: lost 0, doubled 0 with ps 0 killed in the move" \
  bash -c "echo '$out' | grep -q 'lost 0, doubled 0'"
P_RUN=()

# ---- the straight run: 1 ps task all along; the same final values ----
run straight
for p in w0 w1 ps0; do
  rc=0; wait "${!p}" || rc=$?
  check "straight run: $p exits 0 (got $rc)" test "$rc" = 0
done
for name in moving straight; do
  timeout 120 "$B/dtrain_eval" --checkpoint="$dir/$name/ckpt/model.ckpt-$STEPS" --skip_eval \
    --export="$dir/$name.npz" >"$dir/$name.export.log" 2>&1 || { echo "export of $name:"; tail -3 "$dir/$name.export.log"; }
done
check "the final values equal the unchanged run's" \
  /usr/bin/python3 "$ROOT/tests/compare_values.py" "cnn after 1 -> 2 -> 3 -> 2 -> 1 ps tasks" "$dir/moving.npz" "$dir/straight.npz"

echo "ps_set_change_test: $passed passed, $failed failed"
if [ "$failed" != 0 ]; then
  for f in "$m"/*.log; do echo "== $f"; tail -n 6 "$f"; done
  exit 1
fi
