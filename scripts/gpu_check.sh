#!/usr/bin/env bash
# One command for a GPU machine: build with CUDA (or use existing binaries), run every GPU test binary and count
# passed / skipped / failed tests, then benchmark dtrain_bench --towers=gpu:0 on the issue's models (the training
# state on the device, the step replayed as a CUDA graph; and the same with --cuda_graphs=false) and, where the
# python3 on PATH imports a CUDA PyTorch, the same models in PyTorch eager (cudnn.benchmark, data on the GPU, median
# of windows) in the same run, interleaved, and print one table with the ratios; then a 2,400-step cnn run that
# compares its steady-state rate with its early rate (--no-steady skips it).
#
#   scripts/gpu_check.sh                      # configure + build ./build with -DDTRAIN_CUDA=ON, then check
#   scripts/gpu_check.sh --bin build/bin      # use binaries already built
#   bash .devpack/on_device.sh bash "$PWD/scripts/gpu_check.sh"   # on the GPU machine: DTRAIN_BIN is the unpacked
#                                                                 # pack's bin/ (../shared/device/pack.sh)
# Options: --build DIR (default build), --bin DIR (skip the build; default $DTRAIN_BIN when set), --python PATH
# (PyTorch's interpreter, default python3), --no-torch, --no-bench, --no-tests, --no-steady, --repeats N
# (launches of each system per model, default 1), --windows N (default 5), --strict-fp32 (forbid TF32 in
# PyTorch: its cuDNN convolutions use TF32 tensor cores by default, dtrain's CUDA backend computes in strict fp32).
#
# Without a GPU it says so and exits 0 after building. Exit code 1 when a test or a benchmark failed, 2 on bad
# usage or a failed build.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build="$repo/build"
bin="${DTRAIN_BIN:-}"
python=python3
torch=1 bench=1 tests=1 steady=1 repeats=1 windows=5 strict=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --no-torch) torch=0; shift ;;
    --no-bench) bench=0; shift ;;
    --no-tests) tests=0; shift ;;
    --no-steady) steady=0; shift ;;
    --repeats) repeats="$2"; shift 2 ;;
    --windows) windows="$2"; shift 2 ;;
    --strict-fp32) strict=(--strict_fp32); shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# ---- build (unless binaries were given) ----
if [ -z "$bin" ]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  echo "gpu_check: building $build with CUDA"
  if ! cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_CUDA=ON "${launcher[@]}" >/dev/null ||
     ! nice -n 10 cmake --build "$build" -j"$(nproc)"; then
    echo "gpu_check: the CUDA build failed" >&2
    exit 2
  fi
  bin="$build/bin"
fi
[ -x "$bin/dtrain_bench" ] || { echo "gpu_check: no dtrain_bench in $bin" >&2; exit 2; }

# ---- is there a GPU? ----
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -eq 0 ]; then
  echo "gpu_check: no GPU on this machine (nvidia-smi lists none): binaries in $bin are built;" \
       "GPU tests and benchmarks not run"
  exit 0
fi
echo "gpu_check: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)" \
     "($gpus GPU(s)); binaries from $bin"
logs=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
failed=0

# ---- GPU tests ----
if [ $tests = 1 ]; then
  total_pass=0 total_skip=0 total_fail=0
  printf '\n%-24s %7s %8s %7s  %s\n' "test binary" passed skipped failed log
  for t in cuda_device_test cuda_ops_test cuda_imported_ops_test cuda_optimizer_test cuda_async_test nccl_allreduce_test \
           towers_test sparse_batch_test gpu_training_test gpu_process_test; do
    if [ ! -x "$bin/$t" ]; then
      printf '%-24s %s\n' "$t" "missing from $bin"
      failed=1
      continue
    fi
    log="$logs/$t.log"
    (cd "$bin" && DTRAIN_BIN_DIR="$bin" timeout 900 "./$t") >"$log" 2>&1
    rc=$?
    pass=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    skip=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    fail=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    pass=${pass:-0} skip=${skip:-0} fail=${fail:-0}
    if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ "$fail" -eq 0 ]; then fail=1; fi  # crashed or timed out
    note=""
    if [ $rc -eq 124 ]; then note=" (timed out)"; fi
    printf '%-24s %7d %8d %7d  %s%s\n' "$t" "$pass" "$skip" "$fail" "$log" "$note"
    total_pass=$((total_pass + pass)) total_skip=$((total_skip + skip)) total_fail=$((total_fail + fail))
  done
  printf '%-24s %7d %8d %7d\n' "total" "$total_pass" "$total_skip" "$total_fail"
  [ $total_fail -eq 0 ] || failed=1
fi

# ---- benchmarks: dtrain vs PyTorch eager, same GPU, same run, interleaved ----
if [ $bench = 1 ]; then
  have_torch=0 tf32=""
  if [ $torch = 1 ] && "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    have_torch=1
    echo "gpu_check: PyTorch $("$python" -c 'import torch; print(torch.__version__)') with CUDA in $python"
  elif [ $torch = 1 ]; then
    echo "gpu_check: $python cannot import a CUDA PyTorch: dtrain only (--python PATH to point at one)"
  fi
  # model:batch:warm-up steps:steps per window (windows of roughly half a second or more on an H100)
  configs="cnn:50:20:100 cnn:128:20:60 convnet:256:10:20 mlp:100:50:400 cifar10:128:20:100"
  rows=()
  # One dtrain_bench launch on gpu:0; prints its median (or -).
  run_dtrain() {  # log model batch warm steps [extra flags...]
    local log=$1 model=$2 batch=$3 warm=$4 steps=$5 v
    shift 5
    timeout 900 "$bin/dtrain_bench" --model="$model" --batch_size="$batch" --towers=gpu:0 --threads=1 \
      --warmup_steps="$warm" --window_steps="$steps" --windows="$windows" --steps_total=0 "$@" >"$log" 2>&1
    v=$(sed -n 's/^dtrain_bench: .*examples\/sec median=\([0-9.]*\).*/\1/p' "$log")
    if [ -z "$v" ]; then echo "  dtrain $model b$batch $* failed: $(tail -2 "$log" | tr '\n' ' ')" >&2; v=-; fi
    echo "$v"
  }
  for c in $configs; do
    IFS=: read -r model batch warm steps <<<"$c"
    d=() e=() p=() g=""
    for ((r = 1; r <= repeats; r++)); do
      log="$logs/dtrain_${model}_${batch}_$r.log"
      d+=("$(run_dtrain "$log" "$model" "$batch" "$warm" "$steps")")
      g=$(grep -o 'graphs=[a-z]*' "$log" | head -1)
      e+=("$(run_dtrain "$logs/dtrain_eager_${model}_${batch}_$r.log" "$model" "$batch" "$warm" "$steps" \
             --cuda_graphs=false)")
      if [ $have_torch = 1 ]; then
        log="$logs/pytorch_${model}_${batch}_$r.log"
        timeout 900 "$python" "$here/compare_pytorch.py" --pytorch_child --device=cuda --model="$model" \
          --batch_size="$batch" --threads=1 --warmup_steps="$warm" --window_steps="$steps" --windows="$windows" \
          "${strict[@]}" >"$log" 2>&1
        v=$(sed -n 's/^pytorch_bench: .*examples\/sec median=\([0-9.]*\).*/\1/p' "$log")
        if [ -z "$v" ]; then echo "  PyTorch $model b$batch failed: $(tail -2 "$log" | tr '\n' ' ')"; failed=1; v=-; fi
        tf32=$(grep -o 'tf32=[^ ]*' "$log" | head -1)
        p+=("$v")
      fi
    done
    case " ${d[*]} ${e[*]} " in *" - "*) failed=1 ;; esac
    rows+=("$model $batch ${g:-graphs=?} ${d[*]} | ${e[*]} | ${p[*]:-}")
  done
  echo
  echo "Training examples/sec on gpu:0 (median of $windows windows per launch; median over $repeats launch(es);" \
       "dtrain: the training state on the device, strict fp32, the step replayed as a CUDA graph, and eager with" \
       "--cuda_graphs=false; PyTorch eager, cudnn.benchmark, data on the GPU${tf32:+, PyTorch $tf32})"
  printf '%-8s %5s %10s %10s %10s %7s %7s   %s\n' model batch dtrain eager PyTorch ratio eager/Pt \
    "per launch: dtrain | eager | PyTorch"
  for row in "${rows[@]}"; do
    python3 - "$row" <<'EOF'
import statistics, sys
first, eager, torch = sys.argv[1].split("|")
model, batch, graphs, *d = first.split()
e, p = eager.split(), torch.split()
med = lambda xs: statistics.median([float(x) for x in xs if x != "-"]) if any(x != "-" for x in xs) else None
dm, em, pm = med(d), med(e), med(p)
show = lambda v: f"{v:10.0f}" if v is not None else f"{'-':>10}"
ratio = lambda a: f"{a / pm:6.2f}x" if a and pm else f"{'-':>7}"
note = "" if graphs == "graphs=on" else f"   ({graphs}: the step did not run as a CUDA graph, see the log)"
print(f"{model:8} {int(batch):5d} {show(dm)} {show(em)} {show(pm)} {ratio(dm)} {ratio(em)}   "
      f"{' '.join(d)} | {' '.join(e)} | {' '.join(p)}{note}")
EOF
  done
fi

# ---- steady state: a 2,400-step cnn run keeps its early rate (denormals, allocator growth, clocks) ----
if [ $bench = 1 ] && [ $steady = 1 ]; then
  log="$logs/dtrain_steady_cnn_50.log"
  timeout 900 "$bin/dtrain_bench" --model=cnn --batch_size=50 --towers=gpu:0 --threads=1 --warmup_steps=20 \
    --window_steps=100 --windows="$windows" --steps_total=2400 >"$log" 2>&1
  line=$(grep '^dtrain_bench: ' "$log")
  early=$(sed -n 's/.*median=\([0-9.]*\).*/\1/p' <<<"$line")
  late=$(sed -n 's/.* steady=\([0-9.]*\).*/\1/p' <<<"$line")
  echo
  if [ -n "$early" ] && [ -n "$late" ]; then
    python3 - "$early" "$late" <<'EOF'
import sys
e, s = float(sys.argv[1]), float(sys.argv[2])
print(f"cnn b50, 2,400 steps on gpu:0: early {e:.0f}, steady {s:.0f} examples/sec: {s / e:.2f}x of the early rate"
      " (target >= 0.95)")
EOF
  else
    echo "  dtrain cnn b50 --steps_total=2400 failed: $(tail -2 "$log" | tr '\n' ' ')"
    failed=1
  fi
fi

echo
echo "gpu_check: logs in $logs"
exit $failed
