#!/usr/bin/env bash
# ONNX files through the command line, end to end:
#   1. refusals: a missing file, a file that is not ONNX, an unsupported operator, an opset too new, an eval-mode
#      PyTorch export and a model for other images each make dtrain_worker exit 2 with one line naming what is
#      wrong, and write nothing (no checkpoint, event, metrics or export file); dtrain_eval exits 2 likewise;
#   2. a cluster (1 ps + 2 sync workers, scripts/run_local_cluster.sh) trains ResNet-20 (BatchNorm, residual Adds;
#      its running statistics are state on the ps) from --model=FILE.onnx and the chief exports it
#      (--export_onnx); dtrain_eval evaluates the exported file's own weights to the chief's accuracy;
#   3. an independent runtime: onnxruntime-node runs the inference export of that file and of a LeNet-5 trained
#      in local mode on the test images, and its logits match dtrain's evaluation to 1e-4;
#   4. external data: LeNet-5 saved by onnx with its weights in lenet5_ext.onnx.data trains in local mode and
#      exports as trained.onnx + trained.onnx.data, which onnx's checker and onnx.load read (the weights trained)
#      and onnxruntime-node runs with dtrain's logits (1e-4); saved one file per tensor (torch.onnx.export's way
#      over 2 GB) it evaluates exactly as the file with everything inside. (A missing data file and a file over
#      2 GB are among the refusals of 1.)
# Skipped (77) without PyTorch/onnx for /usr/bin/python3, without Node.js and tests/onnxruntime's npm packages
# (scripts/install_deps.sh installs them), or without Fashion-MNIST; with DTRAIN_REQUIRE_DEPS=1 that fails (exit 1).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
DATA=/usr/share/datasets/fashion-mnist
ORT="$ROOT/tests/onnxruntime"
source "$ROOT/tests/skipping.sh"
fail() { echo "FAIL: $*"; exit 1; }
[ -r "$DATA/t10k-images-idx3-ubyte.gz" ] || skip "$DATA is missing (apt-get install dataset-fashion-mnist)"
/usr/bin/python3 -c "import torch, onnx" 2>/dev/null || skip "/usr/bin/python3 lacks torch or onnx (apt-get install python3-torch python3-onnx)"
command -v node >/dev/null || skip "no Node.js (apt-get install nodejs npm)"
[ -d "$ORT/node_modules/onnxruntime-node" ] || skip "onnxruntime-node is not installed in $ORT (scripts/install_deps.sh)"
for b in dtrain_worker dtrain_eval dtrain_ps; do [ -x "$BIN/$b" ] || fail "$BIN/$b not built"; done

WORK="$(mktemp -d /tmp/dtrain_onnx_e2e.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1

# ---- the models ----
/usr/bin/python3 - "$ROOT/examples" <<'PY' >models.log 2>&1 || { cat models.log; fail "exporting the models"; }
import sys
sys.path.insert(0, sys.argv[1])
import onnx
import torch
from onnx import helper, TensorProto
from export_lenet5 import LeNet5
from export_mlp import export
from export_resnet20 import ResNet
torch.manual_seed(0)
export(LeNet5(), torch.zeros(1, 1, 28, 28), "lenet5.onnx")
export(ResNet(blocks=3, in_channels=1), torch.zeros(1, 1, 28, 28), "resnet20.onnx")
export(ResNet(blocks=1, in_channels=3), torch.zeros(1, 3, 32, 32), "cifar_resnet8.onnx")
m = ResNet(blocks=1, in_channels=1)
m.eval()  # what not to do: BatchNorm folded into Conv, weights renamed
torch.onnx.export(m, torch.zeros(1, 1, 28, 28), "eval_mode.onnx", input_names=["x"], dynamic_axes={"x": {0: "N"}})
g = onnx.load("lenet5.onnx")
for n in g.graph.node:
    if n.op_type == "Relu":
        n.op_type = "Selu"  # an operator dtrain does not compute
        break
onnx.save(g, "selu.onnx")
g = onnx.load("lenet5.onnx")
g.opset_import[0].version = 18
onnx.save(g, "opset18.onnx")
# External data: LeNet-5 with its weights in one file beside it (as users save models), and in one file per tensor
# (as torch.onnx.export writes a model over 2 GB); and without its data file.
import os
os.makedirs("ext", exist_ok=True)
os.makedirs("pertensor", exist_ok=True)
os.makedirs("nodata", exist_ok=True)
onnx.save_model(onnx.load("lenet5.onnx"), "ext/lenet5_ext.onnx", save_as_external_data=True,
                all_tensors_to_one_file=True, location="lenet5_ext.onnx.data")
onnx.save_model(onnx.load("lenet5.onnx"), "pertensor/lenet5.onnx", save_as_external_data=True,
                all_tensors_to_one_file=False, size_threshold=0)
onnx.save_model(onnx.load("lenet5.onnx"), "nodata/lenet5_ext.onnx", save_as_external_data=True,
                all_tensors_to_one_file=True, location="lenet5_ext.onnx.data")
os.remove("nodata/lenet5_ext.onnx.data")
PY
echo "this is not an ONNX model" >notes.onnx
truncate -s 2G huge.onnx  # sparse: no disk space

# ---- 1. refusals: exit 2, one line, nothing written ----
refuse() {  # refuse FILE EXPECTED-SUBSTRING
  local file="$1" want="$2" out rc
  rm -rf out && mkdir out
  out="$("$BIN/dtrain_worker" --job_name=local --model="$file" --train_steps=5 --checkpoint_dir=out/ckpt \
    --logdir=out/logs --metrics_file=out/metrics.csv --export_onnx=out/trained.onnx 2>&1)"
  rc=$?
  [ "$rc" = 2 ] || fail "dtrain_worker --model=$file exited $rc, expected 2: $out"
  local lines
  lines="$(printf '%s\n' "$out" | grep -v '^I[0-9]\{8\} ' | grep -c .)"
  [ "$lines" = 1 ] || fail "dtrain_worker --model=$file said $lines lines, expected one: $out"
  printf '%s\n' "$out" | grep -qF -- "$want" || fail "dtrain_worker --model=$file: '$want' not in: $out"
  [ -z "$(ls -A out)" ] || fail "dtrain_worker --model=$file wrote $(ls -A out)"
  out="$("$BIN/dtrain_eval" --model="$file" 2>&1)"
  rc=$?
  [ "$rc" = 2 ] || fail "dtrain_eval --model=$file exited $rc, expected 2: $out"
  echo "refused $file: $(printf '%s\n' "$out" | grep -v '^I[0-9]\{8\} ' | cut -c1-160)..."
}
refuse missing.onnx "missing.onnx"
refuse notes.onnx "notes.onnx: not an ONNX model"
refuse selu.onnx "node '/Relu' (Selu): operator Selu is not supported"
refuse opset18.onnx "opset18.onnx: opset 18 of ai.onnx is not supported (supported: 11-17)"
refuse eval_mode.onnx "an eval-mode export"
refuse cifar_resnet8.onnx "takes 3x32x32 images (C x H x W) but the data set's images are 1x28x28"
refuse nodata/lenet5_ext.onnx \
  "nodata/lenet5_ext.onnx: initializer 'conv2.weight': its external data file 'lenet5_ext.onnx.data' does not exist"
refuse huge.onnx "huge.onnx: 2147483648 bytes, over protobuf's limit of 2147483647 bytes (2 GB)"
grep -q "training=torch.onnx.TrainingMode.TRAINING" <<<"$("$BIN/dtrain_worker" --job_name=local --model=selu.onnx 2>&1)" ||
  fail "the refusal does not say how to export"
out="$("$BIN/dtrain_worker" --job_name=local --model=mlp --export_onnx=x.onnx 2>&1)"
[ $? = 2 ] && grep -q "export_onnx needs a model imported from ONNX" <<<"$out" || fail "--export_onnx with a built-in: $out"

# ---- 2. a cluster trains ResNet-20 from the file; the chief exports it ----
"$ROOT/scripts/run_local_cluster.sh" --ps 1 --workers 2 --logdir "$WORK/cluster" --deadline_secs 300 -- \
  --model="$WORK/resnet20.onnx" --mode=sync --train_steps=12 --batch_size=32 --learning_rate=0.01 \
  --log_every=10 --export_onnx="$WORK/resnet20_trained.onnx" >cluster.log 2>&1 ||
  { tail -30 cluster.log; fail "the cluster run failed"; }
chief_acc="$(grep -o 'step 12: test accuracy = [0-9.]*' cluster.log | grep -o '[0-9.]*$')"
[ -n "$chief_acc" ] || { tail -20 cluster.log; fail "no test accuracy from the chief"; }
[ -s resnet20_trained.onnx ] || fail "the chief exported nothing"
eval_out="$("$BIN/dtrain_eval" --model=resnet20_trained.onnx --export=resnet20_infer.onnx --export_for_inference \
  --logits_out=resnet20_logits.npz 2>&1)" || fail "dtrain_eval of the exported file: $eval_out"
file_acc="$(grep -o 'test accuracy = [0-9.]*' <<<"$eval_out" | grep -o '[0-9.]*$')"
echo "cluster: the chief's test accuracy $chief_acc; the exported file's own weights: $file_acc"
[ "$chief_acc" = "$file_acc" ] || fail "the exported file evaluates to $file_acc, the chief said $chief_acc"
# The running statistics moved on the ps (state slices), away from the file's 0 and 1.
/usr/bin/python3 - <<'PY' || fail "the running statistics were not trained"
import onnx
from onnx import numpy_helper
t = {i.name: numpy_helper.to_array(i) for i in onnx.load("resnet20_trained.onnx").graph.initializer}
assert abs(t["bn.running_mean"]).max() > 1e-3 and abs(t["bn.running_var"] - 1).max() > 1e-3, t["bn.running_var"]
PY

# ---- 3. onnxruntime runs the exported files: the same logits ----
"$BIN/dtrain_worker" --job_name=local --model=lenet5.onnx --train_steps=30 --batch_size=50 --checkpoint_dir=ckpt \
  --log_every=1000 >lenet5.log 2>&1 || { tail lenet5.log; fail "training LeNet-5"; }
"$BIN/dtrain_eval" --checkpoint=ckpt --model=lenet5.onnx --export=lenet5_trained.onnx --logits_out=lenet5_logits.npz \
  >eval.log 2>&1 || { cat eval.log; fail "dtrain_eval of LeNet-5"; }
(cd "$ORT" && node compare_logits.mjs "$WORK/lenet5_trained.onnx" "$WORK/lenet5_logits.npz" \
  "$DATA/t10k-images-idx3-ubyte.gz") || fail "onnxruntime and dtrain disagree on LeNet-5"
(cd "$ORT" && node compare_logits.mjs "$WORK/resnet20_infer.onnx" "$WORK/resnet20_logits.npz" \
  "$DATA/t10k-images-idx3-ubyte.gz") || fail "onnxruntime and dtrain disagree on ResNet-20"
# ---- 4. external data: trained and exported as such; onnx and onnxruntime read the export ----
"$BIN/dtrain_worker" --job_name=local --model=ext/lenet5_ext.onnx --train_steps=5 --batch_size=50 \
  --log_every=1000 --export_onnx=ext/trained.onnx >ext.log 2>&1 ||
  { tail ext.log; fail "training LeNet-5 from external data"; }
[ -s ext/trained.onnx ] && [ -s ext/trained.onnx.data ] || fail "no trained.onnx + trained.onnx.data: $(ls ext)"
/usr/bin/python3 - <<'PY' || fail "onnx does not read the export with external data as dtrain wrote it"
import numpy as np
import onnx
from onnx import numpy_helper
onnx.checker.check_model("ext/trained.onnx")  # by path: the checker checks the external data's locations
# Where each initializer is (onnx.load reads the external data in and forgets where it was).
where = {i.name: i for i in onnx.load("ext/trained.onnx", load_external_data=False).graph.initializer}
for name in ("conv2.weight", "fc1.weight", "fc2.weight", "fc3.weight"):
    i = where[name]
    e = {kv.key: kv.value for kv in i.external_data}
    assert i.data_location == onnx.TensorProto.EXTERNAL and not i.raw_data, name
    assert e["location"] == "trained.onnx.data" and int(e["offset"]) % 4096 == 0, (name, e)
for name in ("conv1.weight", "conv1.bias", "fc3.bias"):  # under 1 KB: inside the .onnx file
    assert where[name].data_location != onnx.TensorProto.EXTERNAL and where[name].raw_data, name
# Their values: every one trained (moved from the file's), finite, of the file's shapes.
t = {i.name: numpy_helper.to_array(i) for i in onnx.load("ext/trained.onnx").graph.initializer}
b = {i.name: numpy_helper.to_array(i) for i in onnx.load("ext/lenet5_ext.onnx").graph.initializer}
assert sorted(t) == sorted(b), (sorted(t), sorted(b))
for name in b:
    assert t[name].shape == b[name].shape and np.isfinite(t[name]).all() and np.abs(t[name] - b[name]).max() > 0, name
print("onnx reads ext/trained.onnx: %d initializers, trained, the weights in trained.onnx.data" % len(t))
PY
"$BIN/dtrain_eval" --model=ext/trained.onnx --logits_out=ext_logits.npz >ext_eval.log 2>&1 ||
  { cat ext_eval.log; fail "dtrain_eval of the export with external data"; }
(cd "$ORT" && node compare_logits.mjs "$WORK/ext/trained.onnx" "$WORK/ext_logits.npz" \
  "$DATA/t10k-images-idx3-ubyte.gz") || fail "onnxruntime and dtrain disagree on the export with external data"
# One file per tensor (torch.onnx.export's way over 2 GB): the same logits as the file with everything inside.
for f in lenet5 pertensor/lenet5; do
  "$BIN/dtrain_eval" --model="$f.onnx" --logits_out="$f.npz" >pertensor.log 2>&1 ||
    { cat pertensor.log; fail "dtrain_eval --model=$f.onnx"; }
done
ls pertensor | grep -q '^conv1.weight$' || fail "onnx saved no file per tensor: $(ls pertensor)"
cmp -s lenet5.npz pertensor/lenet5.npz || fail "pertensor/lenet5.onnx evaluates unlike lenet5.onnx"

# The comparison itself fails when it should: a NaN among dtrain's logits (however small the later differences),
# and nothing compared at all.
/usr/bin/python3 - "$WORK/lenet5_logits.npz" "$WORK/nan_logits.npz" <<'PY' || fail "writing the NaN logits"
import sys
import numpy as np
z = np.load(sys.argv[1])
logits = z["logits"].copy()
logits[0, 3] = np.nan
np.savez(sys.argv[2], logits=logits, labels=z["labels"])
PY
for bad in "nan_logits.npz" "lenet5_logits.npz --count=0"; do
  read -r npz count <<< "$bad"
  rc=0
  (cd "$ORT" && node compare_logits.mjs "$WORK/lenet5_trained.onnx" "$WORK/$npz" "$DATA/t10k-images-idx3-ubyte.gz" \
    ${count:+"$count"} >"$WORK/bad_compare.log" 2>&1) || rc=$?
  [ "$rc" = 1 ] || { cat "$WORK/bad_compare.log"; fail "compare_logits.mjs on $bad exited $rc, not 1"; }
done
echo PASS
