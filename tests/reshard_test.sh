#!/usr/bin/env bash
# Growing and shrinking the ps set from a checkpoint (ps/checkpoint/checkpoint_reshard.h), with real processes:
# 2 sync workers (deterministic input: one seed, one thread each) train, the cluster is stopped, and started again
# on the same checkpoint directory with another number of ps tasks:
#   straight  1 ps task from step 0 to S3, a checkpoint every C steps (all kept);
#   grown     3 ps tasks resume from the straight run's checkpoint of S1 (copied to a directory of its own) to S2
#             (1 -> 3);
#   shrunk    then 2 ps tasks resume from the 3 tasks' checkpoint to S3 (3 -> 2).
# Dense variables move by name, sparse rows by id, with their optimizer slots, and BatchNorm's running statistics
# with them. Checks, for two models: dlrm (embedding tables on the ps: Adam dense, Adagrad rows; synthetic
# click-through data the test writes) and a small conv net with BatchNorm exported from PyTorch (Adam; its running
# statistics are state slices on the ps; on a small slice of Fashion-MNIST the test writes, so that every process
# starts quickly):
#   - each resumed ps task logs that it restored the checkpoint "resharded from 1 ps task onto 3" (and "from 3 ps
#     tasks onto 2"), and training resumes at S1 (S2);
#   - the values saved at S2 by the grown run and at S3 by the shrunk run (every dense variable and BatchNorm
#     statistic, every table's rows, as dtrain_eval --export writes them) are within 1e-6 of the straight run's
#     at the same steps (the largest difference is printed; in sync mode it is 0);
#   - scripts/check_updates.py, on the three runs' journals (--journal_applied, --push_journal_dir), finds every
#     push acknowledged applied exactly once on the 2 tasks of the end, or undone (the straight run's after S1),
#     nothing lost or doubled (tests/reshard_journal_test.sh injects faults into such journals).
# Needs python3-torch (the conv net's export) and Fashion-MNIST: exit 77 without (exit 1 with DTRAIN_REQUIRE_DEPS=1).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$(dirname "$0")/skipping.sh"
for b in dtrain_ps dtrain_worker dtrain_eval dtrain_convert; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
/usr/bin/python3 -c "import torch" 2>/dev/null || skip "/usr/bin/python3 cannot import torch (apt-get install python3-torch)"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
dir="$(mktemp -d /tmp/dtrain_reshard_test.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME NUM_PS STEPS CKPT: NUM_PS ps tasks and 2 sync workers on fresh ports (flags: model_flags, train_flags).
run() {
  local name=$1 num_ps=$2 steps=$3 ckpt=$4 rc=0 p i
  local ports ps_hosts=""
  IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" $((num_ps + 2)))
  for ((i = 0; i < num_ps; i++)); do ps_hosts+="${ps_hosts:+,}127.0.0.1:${ports[$i]}"; done
  local cluster=(--ps_hosts="$ps_hosts" --worker_hosts="127.0.0.1:${ports[$num_ps]},127.0.0.1:${ports[$((num_ps + 1))]}")
  pids=()
  for ((i = 0; i < num_ps; i++)); do
    timeout 180 "$BIN/dtrain_ps" --job_name=ps --task_index=$i "${cluster[@]}" --checkpoint_dir="$ckpt" \
      --save_checkpoint_steps="$save" --keep_checkpoints=0 --journal_applied > "$dir/$name.ps$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 0; do
    timeout 180 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" "${model_flags[@]}" \
      "${train_flags[@]}" --mode=sync \
      --train_steps="$steps" --threads=1 --seed=5 --log_every=1000 --push_journal_dir="$dir/${name%_*}_pushes" \
      > "$dir/$name.w$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  if [ "$rc" != 0 ]; then
    fail "$name: a process exited $rc"
    tail -n 4 "$dir/$name".*.log
  fi
}

# export NAME CKPT_PREFIX: the checkpoint's saved values as $dir/NAME.npz.
export_values() {
  local name=$1 ckpt=$2
  timeout 120 "$BIN/dtrain_eval" --checkpoint="$ckpt" "${model_flags[@]}" --skip_eval --export="$dir/$name.npz" \
    > "$dir/$name.export.log" 2>&1 || { fail "dtrain_eval --export of $ckpt"; tail -3 "$dir/$name.export.log"; }
}

# compare WHAT A B: every array of A.npz within 1e-6 of B.npz's.
compare() {
  /usr/bin/python3 "$ROOT/tests/compare_values.py" "$1" "$dir/$2.npz" "$dir/$3.npz" ||
    fail "$1: the values differ from the unchanged run's"
}

# check_updates NAME S1 S2 S3: the journals of the straight, grown and shrunk runs, nothing lost or doubled.
check_updates() {
  local name=$1 s1=$2 s2=$3 s3=$4 out rc=0
  out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$dir/${name}_straight" --ps_dir="$dir/${name}_changed" \
    --worker_dir="$dir/${name}_pushes" --json 2>&1) || rc=$?
  echo "$out" | grep -v '^{' | tail -1
  python3 - "$rc" "$(echo "$out" | grep '^{' | tail -1)" $((2 * (s3 + s3 - s1))) $((2 * s3)) $((2 * (s3 - s1))) <<'PY' ||
import json, sys
rc, counts, accepted, once, undone = int(sys.argv[1]), json.loads(sys.argv[2] or "{}"), *map(int, sys.argv[3:])
want = dict(lost=0, doubled=0, ps_tasks=2, accepted=accepted, applied_once=once, undone=undone)
got = {k: counts.get(k, 0) for k in want}
sys.exit(0 if rc == 0 and got == want else "exit %d, %s (want exit 0, %s)" % (rc, got, want))
PY
    fail "$name: the update checker on the journals of 1 -> 3 -> 2 ps tasks"
}

# reshard_case NAME S1 S2 S3 (flags: model_flags for workers and dtrain_eval, train_flags for workers only)
reshard_case() {
  local name=$1 s1=$2 s2=$3 s3=$4
  local start=$SECONDS
  run "${name}_straight" 1 "$s3" "$dir/${name}_straight"
  mkdir -p "$dir/${name}_changed"
  cp "$dir/${name}_straight/model.ckpt-$s1.ps0-of-1" "$dir/${name}_changed/" ||
    fail "$name: the straight run saved no checkpoint of step $s1"
  run "${name}_grown" 3 "$s2" "$dir/${name}_changed"
  for i in 0 1 2; do
    grep -q "restored .*model.ckpt-$s1.ps\*-of-1 resharded from 1 ps task onto 3" "$dir/${name}_grown.ps$i.log" ||
      fail "$name: ps task $i of 3 did not restore step $s1 resharded from 1 task"
  done
  grep -q "^resuming at global step $s1$" "$dir/${name}_grown.w0.log" || fail "$name: 3 ps tasks did not resume at $s1"
  run "${name}_shrunk" 2 "$s3" "$dir/${name}_changed"
  for i in 0 1; do
    grep -q "restored .*model.ckpt-$s2.ps\*-of-3 resharded from 3 ps tasks onto 2" "$dir/${name}_shrunk.ps$i.log" ||
      fail "$name: ps task $i of 2 did not restore step $s2 resharded from 3 tasks"
  done
  grep -q "^resuming at global step $s2$" "$dir/${name}_shrunk.w0.log" || fail "$name: 2 ps tasks did not resume at $s2"
  export_values "${name}_straight_s2" "$dir/${name}_straight/model.ckpt-$s2"
  export_values "${name}_straight_s3" "$dir/${name}_straight/model.ckpt-$s3"
  export_values "${name}_grown" "$dir/${name}_changed/model.ckpt-$s2"
  export_values "${name}_shrunk" "$dir/${name}_changed/model.ckpt-$s3"
  compare "$name 1 -> 3 ps at step $s2" "${name}_grown" "${name}_straight_s2"
  compare "$name 3 -> 2 ps at step $s3" "${name}_shrunk" "${name}_straight_s3"
  check_updates "$name" "$s1" "$s2" "$s3"
  echo "$name: $((SECONDS - start)) s"
}

# dlrm: tables on the ps, 2 of every row's slots (Adagrad), Adam's 2 for the dense variables.
"$BIN/dtrain_convert" --synthetic_ctr --examples=6000 --test_examples=500 --out="$dir/ctr" | tail -1
save=20
model_flags=(--model=dlrm --data_dir="$dir/ctr" --data_format=criteo --table_rows=2000 --embedding_dim=8)
train_flags=(--batch_size=64)
reshard_case dlrm 40 80 120

# A conv net with BatchNorm, exported from PyTorch in training mode, and 2048 training and 256 test images of
# Fashion-MNIST in IDX files of their own.
/usr/bin/python3 - "$dir/bn.onnx" "$dir/fashion" <<'PY'
import gzip, os, struct, sys
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(),
                      nn.Linear(4 * 7 * 7, 10))
model.train()
torch.onnx.export(model, torch.zeros(1, 1, 28, 28), sys.argv[1], input_names=["x"], output_names=["logits"],
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                  dynamic_axes={"x": {0: "N"}}, opset_version=14)
os.makedirs(sys.argv[2])
src = "/usr/share/datasets/fashion-mnist"
for split, n in (("train", 2048), ("t10k", 256)):
    for kind, item in (("images-idx3", 784), ("labels-idx1", 1)):
        raw = gzip.open("%s/%s-%s-ubyte.gz" % (src, split, kind)).read()
        head = 16 if item == 784 else 8
        out = bytearray(raw[:head])
        struct.pack_into(">I", out, 4, n)
        out += raw[head:head + n * item]
        with gzip.open("%s/%s-%s-ubyte.gz" % (sys.argv[2], split, kind), "wb") as f:
            f.write(bytes(out))
PY
save=10
model_flags=(--model="$dir/bn.onnx" --data_dir="$dir/fashion")
train_flags=(--optimizer=adam --learning_rate=0.001 --batch_size=32)
reshard_case bn 20 40 60

if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed ($failures checks)"
exit 1
