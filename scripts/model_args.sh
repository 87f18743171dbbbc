# Sourced by the launchers (scripts/run_local_cluster.sh, deploy/launch_cluster.sh, deploy/slurm/dtrain.sbatch):
#   resolve_model_args NAME WORKER_FLAGS...
# A --model=PATH.onnx (or --model PATH.onnx) among the worker flags must name a readable file, checked before any
# task starts; its path becomes absolute, so that tasks started in another directory (ssh shells start in $HOME)
# find it at the same path. The flags, so rewritten, are left in the array MODEL_ARGS. Exits 2 with
# "NAME: --model=PATH: ..." when the file is not there. Built-in model names pass unchanged.
resolve_model_args() {
  local name="$1" a path next=0 separate=0
  shift
  MODEL_ARGS=()
  for a in "$@"; do
    if [ "$next" = 1 ]; then
      next=0
      separate=1
      path="$a"
    else
      separate=0
      case "$a" in
        --model=*.onnx | --model=*.ONNX) path="${a#--model=}" ;;
        --model) MODEL_ARGS+=("$a"); next=1; continue ;;
        *) MODEL_ARGS+=("$a"); continue ;;
      esac
    fi
    case "$path" in
      *.onnx | *.ONNX)
        [ -f "$path" ] && [ -r "$path" ] || { echo "$name: --model=$path: no such readable file" >&2; exit 2; }
        path="$(cd "$(dirname "$path")" && pwd)/$(basename "$path")" ;;
    esac
    # (Not by looking back at MODEL_ARGS: with the model the first flag, that array is still empty, and an index
    # of -1 into it is a "bad array subscript".)
    if [ "$separate" = 1 ]; then MODEL_ARGS+=("$path"); else MODEL_ARGS+=("--model=$path"); fi
  done
}
