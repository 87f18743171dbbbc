#!/usr/bin/env bash
# dlrm on a real cluster: 2 ps tasks + 2 sync workers, each its own process on 127.0.0.1, on synthetic
# click-through-rate data the test writes (dtrain_convert --synthetic_ctr: a planted signal), embedding tables on
# the ps tasks with checkpoints on. Checks that
#   1. the chief's final test AUC is above 0.6 (the planted model's is about 0.85; chance is 0.5), and both ps
#      tasks checkpointed the end of training with their tables' rows;
#   2. the same cluster started again with more steps resumes from those checkpoints (the global step goes on
#      from where it stopped; each ps task restores its rows) and trains to the new end, with the final metrics
#      of an uninterrupted run of as many steps (sync, every worker aggregated: the same batches and updates),
#      and final saved values (dense variables, every table's rows) bit-identical to that run's;
#   3. dtrain_eval on the final checkpoint reports the chief's final test AUC and log loss (to 1e-4).
# Every process is bounded in time. Exits 0 when all hold, 1 otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
for b in dtrain_ps dtrain_worker dtrain_eval dtrain_convert; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
dir="$(mktemp -d /tmp/dtrain_dlrm_cluster.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

"$BIN/dtrain_convert" --synthetic_ctr --examples=20000 --test_examples=4000 --out="$dir/ctr" | tail -1
model_flags=(--model=dlrm --data_dir="$dir/ctr" --data_format=criteo --embedding_dim=8)
steps1=150
steps2=250

# run_cluster NAME STEPS CKPT: 2 ps tasks and 2 workers on fresh ports, checkpoints in CKPT, logs in
# $dir/NAME.*.log; returns non-zero when a process fails or outlives the deadline.
run_cluster() {
  local name=$1 steps=$2 ckpt=$3 rc=0 p
  IFS=, read -r p0 p1 w0 w1 < <(python3 "$ROOT/scripts/free_ports.py" 4)
  local cluster=(--ps_hosts=127.0.0.1:$p0,127.0.0.1:$p1 --worker_hosts=127.0.0.1:$w0,127.0.0.1:$w1)
  pids=()
  for i in 0 1; do
    timeout 120 "$BIN/dtrain_ps" --job_name=ps --task_index=$i "${cluster[@]}" --checkpoint_dir="$ckpt" \
      --save_checkpoint_steps=50 > "$dir/$name.ps$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 0; do
    timeout 120 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" "${model_flags[@]}" \
      --mode=sync --train_steps="$steps" --batch_size=256 --threads=1 --log_every=50 \
      > "$dir/$name.w$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  if [ "$rc" != 0 ]; then
    echo "--- $name: a process exited $rc; the logs' tails:"
    tail -n 5 "$dir/$name".*.log
  fi
  return "$rc"
}

# The chief's final line "step N: test log loss = L, AUC = A, accuracy = X (E examples)" as "N L A".
final_metrics() {
  sed -n 's/^step \([0-9]*\): test log loss = \([0-9.]*\), AUC = \([0-9.]*\), accuracy = .*examples)$/\1 \2 \3/p' "$1" |
    tail -1
}

# 1. Train from scratch.
start=$SECONDS
run_cluster first "$steps1" "$dir/ckpt" || fail "the first cluster failed"
read -r step1 loss1 auc1 <<< "$(final_metrics "$dir/first.w0.log")" || true
echo "first run: step ${step1:-?}, test log loss ${loss1:-?}, AUC ${auc1:-?} ($((SECONDS - start)) s)"
[ "${step1:-}" = "$steps1" ] || fail "the chief's final line is not at step $steps1: '${step1:-}'"
/usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0.6 else 1)" "${auc1:-0}" ||
  fail "test AUC ${auc1:-?} is not above 0.6"
grep -q "^sparse tables: [1-9][0-9]* rows held on 2 ps tasks" "$dir/first.w0.log" || fail "no 'sparse tables:' line"
for i in 0 1; do
  [ -f "$dir/ckpt/model.ckpt-$steps1.ps$i-of-2" ] || fail "ps task $i has no checkpoint of step $steps1"
done

# 2. The same cluster again, with more steps: it resumes from the checkpoints.
start=$SECONDS
run_cluster resumed "$steps2" "$dir/ckpt" || fail "the resumed cluster failed"
grep -q "^resuming at global step $steps1$" "$dir/resumed.w0.log" ||
  fail "the chief did not resume at global step $steps1: $(grep -m1 '^resuming' "$dir/resumed.w0.log" || echo none)"
for i in 0 1; do
  # "restored PATH (step N, S slices, R sparse rows)" at Register, or "... on the chief's request (was at step
  # A, now N, R sparse rows)" when the chief brings every task to the newest step they all hold.
  grep -Eq "restored [^ ]*model\.ckpt-$steps1\.ps$i-of-2 .*(step|now) $steps1, .*[1-9][0-9]* sparse rows" \
    "$dir/resumed.ps$i.log" || fail "ps task $i did not restore its rows of step $steps1"
done
read -r step2 loss2 auc2 <<< "$(final_metrics "$dir/resumed.w0.log")" || true
echo "resumed run: from step $steps1 to ${step2:-?}, test log loss ${loss2:-?}, AUC ${auc2:-?} ($((SECONDS - start)) s)"
[ "${step2:-}" = "$steps2" ] || fail "the resumed chief's final line is not at step $steps2: '${step2:-}'"
# Ps 0's local steps: one per step of the resumed run (workers 0 and 1 each pushed every step from steps1 on).
grep -Eq "^  0 +$((steps2 - steps1)) " "$dir/resumed.w0.log" ||
  fail "ps 0 did not apply $((steps2 - steps1)) pushes of the chief in the resumed run"

# 2b. Sync with every worker aggregated, the resumed run reads the batches an uninterrupted one would and
# restores the rows with their optimizer state: it ends with the same metrics as one run of steps2 steps.
run_cluster straight "$steps2" "$dir/ckpt_straight" || fail "the uninterrupted cluster failed"
read -r step3 loss3 auc3 <<< "$(final_metrics "$dir/straight.w0.log")" || true
echo "uninterrupted run: step ${step3:-?}, test log loss ${loss3:-?}, AUC ${auc3:-?}"
[ "${step3:-}/${loss3:-}/${auc3:-}" = "${step2:-}/${loss2:-}/${auc2:-}" ] ||
  fail "the resumed run ended with step/log loss/AUC ${step2:-}/${loss2:-}/${auc2:-}, an uninterrupted one with" \
       "${step3:-}/${loss3:-}/${auc3:-}"
# Exactly: the saved values of both final checkpoints (every dense variable, every table's ids and rows, as
# dtrain_eval --export writes them) are bit-identical, not just their printed metrics.
for run in resumed:ckpt straight:ckpt_straight; do
  timeout 120 "$BIN/dtrain_eval" --checkpoint="$dir/${run#*:}" "${model_flags[@]}" --skip_eval \
    --export="$dir/${run%%:*}.npz" > "$dir/${run%%:*}_export.log" 2>&1 || fail "dtrain_eval --export of ${run%%:*}"
done
/usr/bin/python3 - "$dir/resumed.npz" "$dir/straight.npz" <<'PY' || fail "the resumed run's saved values differ"
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
if sorted(a.files) != sorted(b.files):
    sys.exit("arrays %s vs %s" % (sorted(a.files), sorted(b.files)))
floats = 0
for k in a.files:
    x, y = a[k], b[k]
    if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
        d = np.abs(x.astype(np.float64) - y.astype(np.float64)).max() if x.shape == y.shape else "shape"
        sys.exit("%s differs: %s vs %s, largest difference %s" % (k, x.shape, y.shape, d))
    floats += x.size if x.dtype == np.float32 else 0
print("saved values bit-identical: %d arrays, %d floats" % (len(a.files), floats))
PY

# 3. dtrain_eval on the newest checkpoint (step steps2) gives the chief's final metrics.
timeout 120 "$BIN/dtrain_eval" --checkpoint="$dir/ckpt" "${model_flags[@]}" > "$dir/eval.log" 2>&1 ||
  fail "dtrain_eval exited $?"
line=$(grep "^checkpoint model.ckpt-" "$dir/eval.log" || true)
echo "dtrain_eval: $line"
if [[ "$line" =~ ^checkpoint\ model\.ckpt-([0-9]+):\ test\ log\ loss\ =\ ([0-9.]+),\ AUC\ =\ ([0-9.]+) ]]; then
  [ "${BASH_REMATCH[1]}" = "$steps2" ] || fail "dtrain_eval read step ${BASH_REMATCH[1]}, not $steps2"
  /usr/bin/python3 - "${BASH_REMATCH[3]}" "${auc2:-0}" "${BASH_REMATCH[2]}" "${loss2:-0}" <<'PY' ||
import sys
auc, chief_auc, loss, chief_loss = map(float, sys.argv[1:])
sys.exit(0 if abs(auc - chief_auc) <= 1e-4 + 1e-9 and abs(loss - chief_loss) <= 1e-4 + 1e-9 else 1)
PY
    fail "dtrain_eval's AUC ${BASH_REMATCH[3]} / log loss ${BASH_REMATCH[2]} differ from the chief's $auc2 / $loss2"
else
  fail "no metrics line from dtrain_eval: $(tail -n 3 "$dir/eval.log")"
fi

if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed ($failures checks)"
exit 1
