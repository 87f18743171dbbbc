#!/usr/bin/env bash
# Workers join and leave a running sync job (dtrain_ps --max_workers, dtrain_worker --elastic_batch=per_worker) on
# 127.0.0.1: the spec lists one worker; worker 1 joins, is killed (kill -9), worker 2 joins; the cnn trains to its
# last step. Checks: each join and leave is one line on ps 0 and on the chief, a joiner takes part in a step soon
# after it starts (printed: the issue's target is 2 s for the cnn, asserted under 15 s for loaded CI machines), the
# run ends complete (exit 0 on ps 0, the chief and worker 2), the push accounting balances, a worker past
# --max_workers and a joiner without --elastic_batch are refused with exit 2 naming the flag.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
dir="$(mktemp -d /tmp/dtrain_elastic_test.XXXXXX)"
bg=()
cleanup() {
  for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -z "${KEEP:-}" ]; then rm -rf "$dir"; else echo "kept $dir"; fi
}
trap cleanup EXIT
passed=0; failed=0
check() {
  local name="$1"; shift
  if "$@"; then echo "ok: $name"; passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi
}
wait_for_line() {  # wait_for_line FILE REGEX SECONDS
  for _ in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

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

set +e
wait "$w0"; rc0=$?
wait "$w2"; rc2=$?
wait "$ps_pid"; rcps=$?
set -e
check "the chief exits 0 (got $rc0)" test "$rc0" = 0
check "worker 2 exits 0 (got $rc2)" test "$rc2" = 0
check "ps 0 exits 0 (got $rcps)" test "$rcps" = 0
check "the run is complete with the comings and goings" \
  grep -q "run complete: training reached step ${ELASTIC_STEPS:-300} of ${ELASTIC_STEPS:-300}; 3 workers took part; left before the end: worker 1 (lost" "$dir/ps.log"
check "the push accounting balances" grep -q "(balanced)" "$dir/ps.log"
echo "$passed passed, $failed failed"
if [ "$failed" != 0 ]; then
  for f in ps w0 w1 w2; do echo "==== $f"; tail -25 "$dir/$f.log"; done
  exit 1
fi
