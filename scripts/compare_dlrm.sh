#!/usr/bin/env bash
# dlrm in dtrain against the same model in PyTorch 1.13, in the same run: examples/sec of
#   - dtrain: local mode, and --num_ps ps tasks + --workers sync workers (scripts/compare_cluster_sizes.py;
#     the cluster's figure is every worker's examples over the training seconds, i.e. the aggregate rate),
#   - PyTorch single process with sparse=True embeddings and sparse Adagrad (scripts/dlrm_pytorch.py --mode=sparse),
#   - PyTorch DDP, --workers ranks over gloo, dense nn.EmbeddingBag gradients (--mode=ddp),
# each process with --threads threads, and prints the ratios. PyTorch's DDP moves every table's whole gradient each
# step, so its run is kept short (--ddp_steps).
#
#   scripts/compare_dlrm.sh --data_dir=/tmp/ctr --table_rows=1000000 --batch_size=512 --examples=200000
#
# The data: Criteo text (train.txt, test.txt), e.g. from
#   build/bin/dtrain_convert --synthetic_ctr --examples=1000000 --test_examples=100000 --out=/tmp/ctr
# Needs python3-torch and libopenblas0-openmp (scripts/install_deps.sh). Memory: the tables' values and Adagrad
# state, 26 x table_rows x dim x 8 bytes: in PyTorch's sparse run (dtrain's ps tasks hold only the rows touched)
# (DDP: per rank, plus a dense gradient of the same size). Flags: --data_dir --table_rows --embedding_dim
# --batch_size --examples --threads --workers --num_ps --ddp_steps --port; exit 2 on a bad one.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=/usr/bin/python3
BIN="${DTRAIN_BIN:-${DTRAIN_BIN_DIR:-$ROOT/build/bin}}"
data_dir="" table_rows=1000000 batch=512 examples=200000 threads=1 workers=2 num_ps=2 ddp_steps=12 dim=16 port=""
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
for arg in "$@"; do
  case "$arg" in
    --data_dir=*) data_dir="${arg#*=}" ;;
    --table_rows=*) table_rows="${arg#*=}" ;;
    --batch_size=*) batch="${arg#*=}" ;;
    --examples=*) examples="${arg#*=}" ;;
    --threads=*) threads="${arg#*=}" ;;
    --workers=*) workers="${arg#*=}" ;;
    --num_ps=*) num_ps="${arg#*=}" ;;
    --ddp_steps=*) ddp_steps="${arg#*=}" ;;
    --embedding_dim=*) dim="${arg#*=}" ;;
    --port=*) port="${arg#*=}" ;;  # DDP's rendezvous on 127.0.0.1 (default: a free one)
    -h | --help) usage ;;
    *) echo "compare_dlrm: unknown argument $arg" >&2; usage ;;
  esac
done
for pair in table_rows:table_rows batch_size:batch examples:examples threads:threads workers:workers num_ps:num_ps \
  ddp_steps:ddp_steps embedding_dim:dim; do
  v="${pair#*:}"
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] ||
    { echo "compare_dlrm: --${pair%%:*} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[ -n "$data_dir" ] || { echo "compare_dlrm: --data_dir=DIR (Criteo train.txt and test.txt) is required" >&2; exit 2; }
[ -r "$data_dir/train.txt" ] || [ -r "$data_dir/train.txt.gz" ] ||
  { echo "compare_dlrm: no train.txt in $data_dir (dtrain_convert --synthetic_ctr writes one)" >&2; exit 2; }
"$PY" -c "import torch" 2>/dev/null || { echo "compare_dlrm: $PY cannot import torch (apt install python3-torch)" >&2; exit 2; }
[ -n "$port" ] || port="$(python3 "$ROOT/scripts/free_ports.py" 1)"
[[ "$port" =~ ^[1-9][0-9]*$ ]] || { echo "compare_dlrm: --port must be a port number, got '$port'" >&2; exit 2; }
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS="$threads"
work="$(mktemp -d /tmp/dtrain_compare_dlrm.XXXXXX)"
trap 'rm -rf "$work"' EXIT

echo "== dtrain: local and $num_ps ps + $workers workers (sync)" >&2
DTRAIN_BIN="$BIN" "$PY" "$ROOT/scripts/compare_cluster_sizes.py" --model=dlrm --data_dir="$data_dir" \
  --data_format=criteo --table_rows="$table_rows" --embedding_dim="$dim" --batch_size="$batch" \
  --examples="$examples" --sizes="$workers" --modes=sync --num_ps="$num_ps" --out="$work/dtrain" \
  -- --threads="$threads" >&2
echo "== PyTorch sparse (1 process)" >&2
"$PY" "$ROOT/scripts/dlrm_pytorch.py" --mode=sparse --data_dir="$data_dir" --table_rows="$table_rows" \
  --dim="$dim" --batch_size="$batch" --threads="$threads" --train_examples="$examples" \
  --steps=$((examples / batch)) >"$work/sparse.json"
echo "== PyTorch DDP ($workers ranks, gloo, dense embedding gradients)" >&2
"$PY" "$ROOT/scripts/dlrm_pytorch.py" --mode=ddp --ranks="$workers" --data_dir="$data_dir" \
  --table_rows="$table_rows" --dim="$dim" --batch_size="$batch" --threads="$threads" \
  --train_examples=$((ddp_steps * batch * workers)) --steps="$ddp_steps" --warmup=2 --window=2 --port="$port" >"$work/ddp.json"

"$PY" - "$work" "$workers" "$num_ps" <<'EOF'
import json, sys
work, workers, num_ps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = json.load(open(work + "/dtrain.json"))["rows"]
local = rows[0]
cluster = [r for r in rows if r["mode"] == "sync" and r["workers"] == workers][0]
def last_json(path):
    return json.loads([l for l in open(path) if l.strip().startswith("{")][-1])
sparse, ddp = last_json(work + "/sparse.json"), last_json(work + "/ddp.json")
c = cluster["examples_per_sec"]
print("%-44s %12s %10s" % ("configuration", "examples/s", "dtrain x"))
print("%-44s %12.1f %10.2f" % ("dtrain local", local["examples_per_sec"], c / local["examples_per_sec"]))
print("%-44s %12.1f %10s" % ("dtrain %d ps + %d workers sync" % (num_ps, workers), c, ""))
print("%-44s %12.1f %10.2f" % ("PyTorch sparse=True, 1 process", sparse["examples_per_sec"],
                               c / sparse["examples_per_sec"]))
print("%-44s %12.1f %10.2f" % ("PyTorch DDP %d ranks (gloo, dense)" % ddp["ranks"], ddp["examples_per_sec"],
                               c / ddp["examples_per_sec"]))
if cluster.get("bytes_per_step"):
    print("dtrain cluster: %s bytes/step on the wire, %s rows held" % (cluster["bytes_per_step"], cluster["rows_held"]))
EOF
