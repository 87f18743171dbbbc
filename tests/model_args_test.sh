#!/usr/bin/env bash
# scripts/model_args.sh: --model=FILE.onnx (or --model FILE.onnx) becomes an absolute path wherever it stands,
# the first flag included (it was once a "bad array subscript" there); built-in names pass unchanged; a missing
# file exits 2 naming it. Pure bash, well under a second.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../scripts/model_args.sh
source "$ROOT/scripts/model_args.sh"
dir="$(mktemp -d /tmp/dtrain_model_args_test.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
touch "$dir/net.onnx"
failed=0
expect() {  # expect "WHAT" "EXPECTED, one flag a line" -- ARGS...
  local what="$1" want="$2" got
  shift 3
  got="$(cd "$dir" && resolve_model_args test "$@" 2>&1 && printf '%s\n' "${MODEL_ARGS[@]}")"  # stderr too: no complaint
  if [ "$got" = "$want" ]; then echo "ok: $what"; else
    echo "FAIL: $what: got"; echo "$got"; echo "want"; echo "$want"; failed=1
  fi
}
expect "model file first" "--model=$dir/net.onnx
--train_steps=5" -- --model=net.onnx --train_steps=5
expect "model file later" "--train_steps=5
--model=$dir/net.onnx" -- --train_steps=5 --model=./net.onnx
expect "model file as a separate word, first" "--model
$dir/net.onnx
--x=1" -- --model net.onnx --x=1
expect "a built-in model" "--model=mlp
--x=1" -- --model=mlp --x=1
rc=0; out="$( (cd "$dir" && resolve_model_args test --model=missing.onnx) 2>&1)" || rc=$?
if [ "$rc" = 2 ] && grep -q "test: --model=missing.onnx: no such readable file" <<<"$out"; then
  echo "ok: a missing file exits 2 naming it"
else
  echo "FAIL: missing file: rc=$rc: $out"; failed=1
fi
exit "$failed"
