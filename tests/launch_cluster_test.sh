#!/usr/bin/env bash
# deploy/launch_cluster.sh end to end on 127.0.0.1: a JSON cluster spec of 1 ps + 2 workers trains the MLP
# (async, TF_CONFIG per task) and every task exits 0; a malformed spec is refused with exit code 2.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export DTRAIN_BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
# Exit 77 (ctest: Skipped, SKIP_RETURN_CODE) with the reason when what the test needs is not installed.
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: dataset-fashion-mnist is not installed (scripts/install_deps.sh)"; exit 77
fi
if ! command -v python3 >/dev/null; then echo "SKIP: python3 (scripts/free_ports.py) is not installed"; exit 77; fi
dir="$(mktemp -d /tmp/dtrain_launch_test.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
IFS=, read -r p0 p1 p2 <<<"$(python3 "$ROOT/scripts/free_ports.py" 3)"
echo "{\"ps\": [\"127.0.0.1:$p0\"], \"worker\": [\"127.0.0.1:$p1\", \"127.0.0.1:$p2\"]}" >"$dir/cluster.json"
out="$(timeout 300 "$ROOT/deploy/launch_cluster.sh" --cluster_spec="$dir/cluster.json" --logdir="$dir/logs" \
       -- --model=mlp --mode=async --train_steps=200 --log_every=100 2>&1)"
rc=$?
echo "$out"
if [ "$rc" != 0 ]; then echo "FAIL: launch_cluster exited $rc"; exit 1; fi
if ! grep -q "test accuracy = " <<<"$out"; then echo "FAIL: no test accuracy line"; exit 1; fi
for f in ps_0 worker_0 worker_1; do
  [ -s "$dir/logs/$f.log" ] || { echo "FAIL: no log for $f"; exit 1; }
done
echo '{"ps": [], "worker": ["127.0.0.1:1"]}' >"$dir/bad.json"
"$ROOT/deploy/launch_cluster.sh" --cluster_spec="$dir/bad.json" -- --model=mlp >"$dir/bad.out" 2>&1
rc=$?
cat "$dir/bad.out"
if [ "$rc" != 2 ] || ! grep -q "non-empty 'ps' list" "$dir/bad.out"; then echo "FAIL: bad spec not refused"; exit 1; fi
echo "1 passed, 0 failed"
