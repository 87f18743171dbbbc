#!/usr/bin/env bash
# An async elastic job of a model with sparse tables (dlrm: its embedding rows on the ps, pulled with the pull
# before the step that uses them) on 127.0.0.1: ps 0 holds each worker's next batch a pull ahead
# (ElasticView::next_batch, ps/core/elastic_plan.h), so the rows a worker pulls are those of the batch it trains.
# Worker 0 starts, worker 1 joins, worker 2 joins, worker 1 is killed with kill -9 (its batches go back to the
# queue), and the run trains to its last step. Checks: ps 0 logs each change; the run completes (ps 0, workers 0
# and 2 exit 0); each surviving worker drew its batches again on at most 2 steps (its first; without the held
# batch it would be every step); scripts/check_updates.py finds no push lost or doubled.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
passed=0; failed=0
source "$ROOT/tests/checks.sh"
make_test_dir dtrain_async_sparse_test

STEPS=${ASYNC_SPARSE_STEPS:-600}
"$B/dtrain_convert" --synthetic_ctr --examples=20000 --test_examples=1000 --out="$dir/ctr" >/dev/null
IFS=, read -r p0 p1 <<<"$(python3 "$ROOT/scripts/free_ports.py" 2)"
C=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1)
W=(--job_name=worker --model=dlrm --data_dir="$dir/ctr" --data_format=criteo --embedding_dim=8 --mode=async
   --elastic_batch=per_worker --batch_size=64 --train_steps=$STEPS --threads=1 --seed=7 --log_every=5
   --eval_every=0 --rpc_timeout_secs=30 --startup_wait_secs=60 --debug_step_delay_ms=30
   --push_journal_dir="$dir/pushes")
"$B/dtrain_ps" "${C[@]}" --job_name=ps --task_index=0 --max_workers=3 --worker_timeout_secs=2 --journal_applied \
  --checkpoint_dir="$dir/ckpt" >"$dir/ps.log" 2>&1 &
ps_pid=$!; bg+=($ps_pid)
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=0 >"$dir/w0.log" 2>&1 &
w0=$!; bg+=($w0)
wait_step "$dir/w0.log" 20
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=1 >"$dir/w1.log" 2>&1 &
w1=$!; bg+=($w1)
check "ps 0 logs worker 1's join" wait_for_line "$dir/ps.log" "worker 1 joined (2 workers, async" 60
wait_step "$dir/w0.log" 80
"$B/dtrain_worker" "${C[@]}" "${W[@]}" --task_index=2 >"$dir/w2.log" 2>&1 &
w2=$!; bg+=($w2)
check "ps 0 logs worker 2's join" wait_for_line "$dir/ps.log" "worker 2 joined (3 workers, async" 60
wait_for_line "$dir/w2.log" "^step [0-9]*, loss" 60 || true
wait_step "$dir/w0.log" 160
kill -KILL "$w1"; wait "$w1" 2>/dev/null || true
check "ps 0 logs worker 1's leave" wait_for_line "$dir/ps.log" "worker 1 left (2 workers, async" 30
for p in w0 w2 ps_pid; do
  rc=0; wait "${!p}" || rc=$?
  check "$p exits 0 (got $rc)" test "$rc" = 0
done
check "the run completes" grep -q "run complete: training reached step $STEPS of $STEPS" "$dir/ps.log"
for w in 0 2; do
  redrawn=$(sed -n "s/^worker $w: \([0-9]*\) step(s) drew their batches again.*/\1/p" "$dir/w$w.log")
  check "worker $w drew its batches again on ${redrawn:-0} step(s) (at most 2: its first)" test "${redrawn:-0}" -le 2
  steps=$(sed -n "s/^worker $w: \([0-9]*\) local steps.*/\1/p" "$dir/w$w.log")
  check "...of ${steps:-0} local steps (more than 20)" test "${steps:-0}" -gt 20
done
out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$dir/ckpt" --worker_dir="$dir/pushes" 2>&1) || true
echo "$out" | tail -1
check "check_updates: lost 0, doubled 0" bash -c "echo '$out' | grep -q 'lost 0, doubled 0'"

echo "elastic_async_sparse_test: $passed passed, $failed failed"
if [ "$failed" != 0 ]; then
  for f in "$dir"/*.log; do echo "== $f"; tail -n 8 "$f"; done
  exit 1
fi
