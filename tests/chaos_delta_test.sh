#!/usr/bin/env bash
# tests/chaos.sh with deltas: dlrm on small synthetic click-through-rate data, 1 ps (checkpoints every 100 steps and
# a delta every 0.1 s and every 10 steps: on a fast machine the 30 steps between the checkpoint and the kill took
# less than 0.1 s, so no delta was written between them and the test failed) + 3 sync workers. The seed's plan kills the ps between two deltas and starts it again: it must
# restore its newest checkpoint plus every delta written after it (the newest state on disk when it was killed), so
# that it loses at most the steps since the last delta; every other check of chaos.sh holds. Extra arguments go to
# chaos.sh (e.g. --trials=10 --seed=S --keep).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
[ -x "$BIN/dtrain_convert" ] || { echo "FAIL: $BIN/dtrain_convert not built (set DTRAIN_BIN_DIR)"; exit 1; }
data="$(mktemp -d /tmp/dtrain_chaos_delta.XXXXXX)"
trap 'rm -rf "$data"' EXIT
"$BIN/dtrain_convert" --synthetic_ctr --examples=5000 --test_examples=500 --out="$data" >/dev/null
log="$data/chaos.log"
"$ROOT/tests/chaos.sh" --trials=1 --seed=7 --steps=300 --model=dlrm \
  --worker_flags="--data_dir=$data --data_format=criteo --table_rows=1000 --batch_size=64" \
  --ps_flags="--delta_every_secs=0.1 --delta_every_steps=10 --save_checkpoint_steps=100" "$@" | tee "$log"
# The plan must have killed the ps, and it must have restored through deltas (not a checkpoint alone).
grep -q "killed ps at step .*restored step [0-9]* (deltas; lost [0-9-]* steps)" "$log" || {
  echo "FAIL: no trial killed the ps and restored its state through deltas (see above)"; exit 1; }
