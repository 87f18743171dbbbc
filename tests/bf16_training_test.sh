#!/usr/bin/env bash
# --compute_dtype=bf16 as a user runs it (kernels/device.h, ComputeDtype; docs/speed.md).
# 1. Local training of the cnn, fp32 and bf16 from the same seed: both end (exit 0), the bf16 run logs once what
#    its towers computed in (the oneDNN ISA, every convolution and dense layer in bf16 or named, no fp32
#    fallback), the fp32 run logs no such line, and the test accuracies are within 2 points after 300 steps.
# 2. A cluster of 2 ps tasks and 2 sync workers with bf16 towers trains to the end, every worker says bf16.
# 3. dtrain_eval evaluates the local run's checkpoint with bf16 products (within 1 point of fp32's evaluation).
# 4. A bad value is refused by dtrain_worker, dtrain_bench and dtrain_eval (exit 2, the value named).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
if ! command -v python3 >/dev/null; then skip "python3 (scripts/free_ports.py) is not installed"; fi
dir="$(mktemp -d /tmp/dtrain_bf16_test.XXXXXX)"
cleanup() {
  for p in $(pgrep -f -- "$dir/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

passed=0; failed=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then echo "ok: $name"; passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi
}
accuracy() { sed -n 's/.*test accuracy = \([0-9.]*\) .*/\1/p' "$1" | tail -1; }
within() {  # within A B POINTS: |A - B| * 100 <= POINTS
  python3 -c "import sys; a, b, p = map(float, sys.argv[1:]); sys.exit(abs(a - b) * 100 > p)" "$1" "$2" "$3"
}
REPORT="towers: compute bf16 (fp32 accumulation) on oneDNN's"

# 1. Local, fp32 and bf16 from the same seed.
for dtype in fp32 bf16; do
  rc=0
  timeout 300 "$BIN/dtrain_worker" --job_name=local --model=cnn --train_steps=300 --log_every=100 --seed=3 \
    --threads=1 --compute_dtype=$dtype --checkpoint_dir="$dir/ckpt_$dtype" --logdir="$dir/tb_$dtype" \
    >"$dir/local_$dtype.log" 2>&1 || rc=$?
  check "local $dtype: exit 0 (got $rc)" test "$rc" = 0
done
grep -h "towers: compute\|test accuracy" "$dir"/local_*.log || true
check "bf16 run: one line says what the towers computed in" test "$(grep -c "$REPORT" "$dir/local_bf16.log")" = 1
check "bf16 run: its convolutions and dense layers in bf16, no fp32 fallback" \
  grep -q "bf16 [0-9]* conv2d, [0-9]* dense .*fp32 fallback: none" "$dir/local_bf16.log"
check "fp32 run: no such line" bash -c "! grep -q 'towers: compute' '$dir/local_fp32.log'"
a32="$(accuracy "$dir/local_fp32.log")"; a16="$(accuracy "$dir/local_bf16.log")"
echo "test accuracy after 300 steps: fp32 $a32, bf16 $a16"
check "bf16 accuracy within 2 points of fp32's ($a16 vs $a32)" within "${a16:-0}" "${a32:-9}" 2

# 2. 2 ps + 2 sync workers, bf16 towers.
rc=0
timeout 300 "$ROOT/scripts/run_local_cluster.sh" --ps 2 --workers 2 --logdir "$dir/cluster" --deadline_secs 280 -- \
  --mode=sync --model=cnn --train_steps=150 --log_every=50 --threads=1 --compute_dtype=bf16 \
  >"$dir/cluster.out" 2>&1 || rc=$?
tail -3 "$dir/cluster.out"
check "cluster: exit 0 (got $rc)" test "$rc" = 0
check "cluster: worker 0 computes in bf16" grep -q "$REPORT" "$dir/cluster/worker_0.err"
check "cluster: worker 1 computes in bf16" grep -q "$REPORT" "$dir/cluster/worker_1.log"
check "cluster: the chief's test accuracy" grep -q "test accuracy = " "$dir/cluster.out"

# 3. dtrain_eval on the bf16 run's checkpoint, in fp32 and in bf16.
for dtype in fp32 bf16; do
  rc=0
  timeout 120 "$BIN/dtrain_eval" --checkpoint="$dir/ckpt_bf16" --model=cnn --threads=1 --compute_dtype=$dtype \
    >"$dir/eval_$dtype.log" 2>&1 || rc=$?
  check "dtrain_eval $dtype: exit 0 (got $rc)" test "$rc" = 0
done
e32="$(accuracy "$dir/eval_fp32.log")"; e16="$(accuracy "$dir/eval_bf16.log")"
echo "dtrain_eval: fp32 $e32, bf16 $e16"
check "dtrain_eval bf16 within 1 point of fp32 ($e16 vs $e32)" within "${e16:-0}" "${e32:-9}" 1

# 4. A bad value: exit 2 naming it.
for b in "dtrain_worker --job_name=local" dtrain_bench "dtrain_eval --checkpoint=$dir/ckpt_bf16"; do
  rc=0
  # shellcheck disable=SC2086
  out="$("$BIN/"$b --model=cnn --compute_dtype=fp16 2>&1)" || rc=$?
  b="${b%% *}"
  check "$b --compute_dtype=fp16: exit 2 (got $rc)" test "$rc" = 2
  check "$b --compute_dtype=fp16: named" grep -q -- "--compute_dtype=fp16: expected fp32 or bf16" <<<"$out"
done

echo "$passed passed, $failed failed"
test "$failed" = 0
