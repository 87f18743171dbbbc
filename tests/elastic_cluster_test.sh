#!/usr/bin/env bash
# Workers join and leave a running sync job (dtrain_ps --max_workers, dtrain_worker --elastic_batch=per_worker) on
# 127.0.0.1: the spec lists one worker; worker 1 joins, is killed (kill -9), worker 2 joins; the cnn trains to its
# last step. Checks: each join and leave is one line on ps 0 and on the chief, a joiner takes part in a step soon
# after it starts (printed: the issue's target is 2 s for the cnn, asserted under 15 s for loaded CI machines), the
# run ends complete (exit 0 on ps 0 and the chief), the push accounting balances, a worker past --max_workers and a
# joiner without --elastic_batch are refused with exit 2 naming the flag. dtrain_ctl: status lists the workers,
# remove-worker 2 makes worker 2 leave with exit 0 (the chief and a lost worker are refused, one line), and drain
# ends a second job where it is with its state saved.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
passed=0; failed=0
source "$ROOT/tests/checks.sh"
make_test_dir dtrain_elastic_test

IFS=, read -r p0 p1 <<<"$(python3 "$ROOT/scripts/free_ports.py" 2)"
C=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1)
W=(--job_name=worker --model=cnn --mode=sync --train_steps=${ELASTIC_STEPS:-300} --elastic_batch=per_worker
   --threads=1 --log_every=1 --eval_every=0 --rpc_timeout_secs=30 --startup_wait_secs=60)
"$B/dtrain_ps" "${C[@]}" --job_name=ps --task_index=0 --max_workers=3 --worker_timeout_secs=3 >"$dir/ps.log" 2>&1 &
ps_pid=$!; bg+=($ps_pid)
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=0 >"$dir/w0.log" 2>&1 &
w0=$!; bg+=($w0)
wait_for_line "$dir/w0.log" "^step 10," 120 || { echo "FAIL: the chief did not reach step 10"; cat "$dir/w0.log"; exit 1; }

# A worker past --max_workers, and a joiner without --elastic_batch: refused, exit 2, naming the flag.
set +e
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=3 >"$dir/w3.log" 2>&1; rc3=$?
"$B/dtrain_worker" "${C[@]}" --job_name=worker --model=cnn --task_index=1 >"$dir/w1bad.log" 2>&1; rc1bad=$?
set -e
check "a worker past --max_workers exits 2 (got $rc3)" test "$rc3" = 2
check "...naming --max_workers" grep -q "max_workers" "$dir/w3.log"
check "a joiner without --elastic_batch exits 2 (got $rc1bad)" test "$rc1bad" = 2
check "...naming --elastic_batch" grep -q "elastic_batch" "$dir/w1bad.log"

# Worker 1 joins; its first step is timed from its launch (polled every 0.1 s).
launched=$(date +%s.%N)
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=1 >"$dir/w1.log" 2>&1 &
w1=$!; bg+=($w1)
if wait_for_line "$dir/w1.log" "^step [0-9]*, loss" 60; then
  latency=$(python3 -c "import time; print(f'{time.time() - $launched:.2f}')")
  echo "worker 1 took part in its first step $latency s after its launch (the chief at step $(grep -c '^step [0-9]*, loss' "$dir/w0.log"))"
  check "a joiner takes part in a step within 15 s of its launch ($latency s)" python3 -c "import sys; sys.exit(not $latency < 15)"
else
  check "worker 1 took part in a step" false
fi
check "ps 0 logs the join" wait_for_line "$dir/ps.log" "worker 1 joined (2 workers, aggregating 2, global batch [0-9]*)" 10
check "the chief logs the join" wait_for_line "$dir/w0.log" "^step [0-9]*: worker 1 joined (2 workers, aggregating 2, global batch [0-9]*)" 10
sleep 2
kill -KILL "$w1"
check "ps 0 logs the loss" wait_for_line "$dir/ps.log" "worker 1 left (1 worker, aggregating 1, global batch [0-9]*)" 20
check "the chief logs the loss" wait_for_line "$dir/w0.log" "^step [0-9]*: worker 1 left" 20

"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=2 >"$dir/w2.log" 2>&1 &
w2=$!; bg+=($w2)
check "worker 2 joins" wait_for_line "$dir/ps.log" "worker 2 joined (2 workers, aggregating 2, global batch [0-9]*)" 60

# dtrain_ctl: the membership table; refusals are one line; worker 2 removed leaves with exit 0, the run goes on.
CTL=("$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0 --rate_secs=0.5)
"${CTL[@]}" status >"$dir/status.txt" 2>&1 || true
cat "$dir/status.txt"
check "status lists the chief active" grep -Eq "^0 +active" "$dir/status.txt"
check "status lists worker 1 lost" grep -Eq "^1 +lost" "$dir/status.txt"
check "status lists worker 2 active" grep -Eq "^2 +active" "$dir/status.txt"
set +e
"${CTL[@]}" remove-worker 0 >"$dir/rm0.txt" 2>&1; rc=$?
check "removing the chief is refused, exit 1 (got $rc)" test "$rc" = 1
check "...saying why" grep -q "is the chief: it cannot be removed" "$dir/rm0.txt"
"${CTL[@]}" remove-worker 1 >"$dir/rm1.txt" 2>&1; rc=$?
check "removing a lost worker is refused, exit 1 (got $rc)" test "$rc" = 1
"${CTL[@]}" frobnicate >"$dir/bad.txt" 2>&1; rc=$?
check "an unknown command exits 2 (got $rc)" test "$rc" = 2
check "...in one line" test "$(wc -l <"$dir/bad.txt")" = 1
"${CTL[@]}" remove-worker 2 >"$dir/rm2.txt" 2>&1; rc=$?
check "remove-worker 2 exits 0 (got $rc)" test "$rc" = 0
wait "$w2"; rc2=$?
set -e
check "worker 2 exits 0 once removed (got $rc2)" test "$rc2" = 0
check "...saying so" grep -q "worker 2 left the job: removed by dtrain_ctl" "$dir/w2.log"

set +e
wait "$w0"; rc0=$?
wait "$ps_pid"; rcps=$?
set -e
check "the chief exits 0 (got $rc0)" test "$rc0" = 0
check "ps 0 exits 0 (got $rcps)" test "$rcps" = 0
check "the run is complete with the comings and goings" \
  grep -q "run complete: training reached step ${ELASTIC_STEPS:-300} of ${ELASTIC_STEPS:-300}; 3 workers took part; left before the end: worker 1 (lost.*worker 2 (stopped.*removed by dtrain_ctl" "$dir/ps.log"
check "the push accounting balances" grep -q "(balanced)" "$dir/ps.log"

# drain: a second job (mlp, checkpoints) ends where it is, its state saved; the workers stop.
IFS=, read -r p0 p1 <<<"$(python3 "$ROOT/scripts/free_ports.py" 2)"
C=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1)
"$B/dtrain_ps" "${C[@]}" --job_name=ps --task_index=0 --checkpoint_dir="$dir/ckpt" >"$dir/ps2.log" 2>&1 &
ps_pid=$!; bg+=($ps_pid)
"$B/dtrain_worker" "${C[@]}" --job_name=worker --task_index=0 --model=mlp --train_steps=1000000 --threads=1 \
  --log_every=20 --startup_wait_secs=60 >"$dir/d0.log" 2>&1 &
w0=$!; bg+=($w0)
wait_for_line "$dir/d0.log" "^step 100," 60 || true
set +e
"$B/dtrain_ctl" --ps_hosts=127.0.0.1:$p0 drain >"$dir/drain.txt" 2>&1; rc=$?
wait "$w0"; rc0=$?
wait "$ps_pid"; rcps=$?
set -e
cat "$dir/drain.txt"
check "drain exits 0 (got $rc)" test "$rc" = 0
check "the drained ps exits 4, ended early (got $rcps)" test "$rcps" = 4
check "the drained worker stops, exit 4 (got $rc0)" test "$rc0" = 4
step=$(sed -n 's/.*drained at step \([0-9]*\).*/\1/p' "$dir/drain.txt")
check "the state at the drained step $step is saved" test -f "$dir/ckpt/model.ckpt-$step.ps0-of-1"
echo "$passed passed, $failed failed"
if [ "$failed" != 0 ]; then
  for f in ps w0 w1 w2; do echo "==== $f"; tail -25 "$dir/$f.log"; done
  exit 1
fi
